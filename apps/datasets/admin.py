from django.contrib import admin
from django.core.exceptions import PermissionDenied

from apps.core.admin_scoping import TeamScopedAdmin

from .models import Dataset
from .services import dataset_delete


@admin.register(Dataset)
class DatasetAdmin(TeamScopedAdmin, admin.ModelAdmin):
    list_display = ["name", "team", "num_images", "num_classes", "created_at"]
    list_filter = ["team"]
    manager_can_delete = True
    # A registered path is trusted by the training worker: only admins point it somewhere.
    superuser_only_fields = ("team", "name", "yaml_path")

    def delete_model(self, request, obj):
        # Through the service: audited, and the files go so the name no longer resolves.
        if not self.manages(request, obj):
            raise PermissionDenied("you do not manage that team")
        dataset_delete(dataset=obj, by=request.user)

    def delete_queryset(self, request, queryset):
        for dataset in queryset:
            self.delete_model(request, dataset)
