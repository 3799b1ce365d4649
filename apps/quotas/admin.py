from django.contrib import admin

from apps.portal.admin_scoping import TeamScopedAdmin

from .models import UsageRecord


@admin.register(UsageRecord)
class UsageRecordAdmin(TeamScopedAdmin, admin.ModelAdmin):
    list_display = ["job", "attempt", "team", "user", "priority_class", "gpu_seconds", "ended_at"]
    list_filter = ["team", "priority_class"]
    manager_can_change = False  # the ledger is written by the system only
