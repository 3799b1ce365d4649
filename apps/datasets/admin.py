from django.contrib import admin

from .models import Dataset


@admin.register(Dataset)
class DatasetAdmin(admin.ModelAdmin):
    list_display = ["name", "team", "num_images", "num_classes", "created_at"]
    list_filter = ["team"]
