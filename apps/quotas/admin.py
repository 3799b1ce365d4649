from django.contrib import admin

from .models import UsageRecord


@admin.register(UsageRecord)
class UsageRecordAdmin(admin.ModelAdmin):
    list_display = ["job", "attempt", "team", "user", "priority_class", "gpu_seconds", "ended_at"]
    list_filter = ["team", "priority_class"]
