from django.contrib import admin

from apps.core.admin_scoping import TeamScopedAdmin

from .models import ModelVersion


@admin.register(ModelVersion)
class ModelVersionAdmin(TeamScopedAdmin, admin.ModelAdmin):
    list_display = ["name", "version", "team", "job", "size", "created_at"]
    list_filter = ["team"]
    manager_can_change = False
    manager_can_delete = True
