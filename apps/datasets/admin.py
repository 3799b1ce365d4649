from django.contrib import admin
from django.core.exceptions import PermissionDenied

from apps.core.admin_scoping import ChangedFieldsSaveAdmin, GuardedDeleteAdmin, TeamScopedAdmin
from apps.core.values import bytes_in_words

from .models import Dataset
from .services import dataset_delete


@admin.register(Dataset)
class DatasetAdmin(GuardedDeleteAdmin, TeamScopedAdmin, ChangedFieldsSaveAdmin, admin.ModelAdmin):
    list_display = ["name", "version", "team", "kind", "num_images", "num_classes", "size_shown", "created_at"]
    list_filter = ["team", "kind"]
    manager_can_delete = True
    # A registered key is trusted by the training worker: only admins point it somewhere; the
    # content hash and statistics are the platform's.
    superuser_only_fields = ("team", "name", "version", "kind", "key", "yaml_key")
    readonly_fields = ["sha256", "size_shown", "num_images", "num_classes", "names", "stats", "uploaded_by"]
    exclude = ["size_bytes"]

    @admin.display(description="size", ordering="size_bytes")
    def size_shown(self, dataset: Dataset) -> str:
        return bytes_in_words(dataset.size_bytes)

    def delete_model(self, request, obj):
        # Through the service: audited, and the files go so the name no longer resolves.
        if not self.manages(request, obj):
            raise PermissionDenied("you do not manage that team")
        dataset_delete(dataset=obj, by=request.user)

    def delete_queryset(self, request, queryset):
        for dataset in queryset:
            self.delete_model(request, dataset)
