from django.contrib import admin
from django.core.exceptions import PermissionDenied

from apps.core.admin_scoping import TeamScopedAdmin

from .models import ModelVersion
from .services import model_version_delete


@admin.register(ModelVersion)
class ModelVersionAdmin(TeamScopedAdmin, admin.ModelAdmin):
    list_display = ["name", "version", "team", "job", "size", "created_at"]
    list_filter = ["team"]
    manager_can_change = False
    manager_can_delete = True

    def delete_model(self, request, obj):
        # Through the service: audited, and the version number is never issued again.
        if not self.manages(request, obj):
            raise PermissionDenied("you do not manage that team")
        model_version_delete(version=obj, by=request.user)

    def delete_queryset(self, request, queryset):
        for version in queryset:
            self.delete_model(request, version)
