from django.contrib import admin

from apps.core.admin_scoping import TeamScopedAdmin

from .models import Dataset


@admin.register(Dataset)
class DatasetAdmin(TeamScopedAdmin, admin.ModelAdmin):
    list_display = ["name", "team", "num_images", "num_classes", "created_at"]
    list_filter = ["team"]
    manager_can_delete = True
    # A registered path is trusted by the training worker: only admins point it somewhere.
    superuser_only_fields = ("team", "name", "yaml_path")
