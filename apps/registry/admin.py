from django.contrib import admin
from django.core.exceptions import PermissionDenied

from apps.core.admin_scoping import GuardedDeleteAdmin, SuperuserOnlyAdmin, TeamScopedAdmin

from .models import ModelVersion, SharedWeights
from .services import model_version_delete


@admin.register(ModelVersion)
class ModelVersionAdmin(GuardedDeleteAdmin, TeamScopedAdmin, admin.ModelAdmin):
    list_display = ["name", "version", "team", "source", "stage", "task", "job", "size", "created_at"]
    list_filter = ["team", "source", "stage"]
    manager_can_change = False
    manager_can_delete = True
    # Stages change through the portal or the API (managers, audited), never by editing the row.
    readonly_fields = ["stage", "stage_changed_at"]

    def delete_model(self, request, obj):
        # Through the service: audited, and the version number is never issued again.
        if not self.manages(request, obj):
            raise PermissionDenied("you do not manage that team")
        model_version_delete(version=obj, by=request.user)

    def delete_queryset(self, request, queryset):
        for version in queryset:
            self.delete_model(request, version)


@admin.register(SharedWeights)
class SharedWeightsAdmin(SuperuserOnlyAdmin, admin.ModelAdmin):
    """Added with ``manage.py weights add FILE --shared`` (checked first); read-only here."""

    list_display = ["filename", "task", "size", "sha256", "created_at"]
    readonly_fields = ["filename", "key", "sha256", "size", "task", "scan", "added_by", "created_at"]
