from django.contrib import admin

from .models import ModelVersion


@admin.register(ModelVersion)
class ModelVersionAdmin(admin.ModelAdmin):
    list_display = ["name", "version", "team", "job", "size", "created_at"]
    list_filter = ["team"]
