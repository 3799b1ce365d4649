from django.contrib import admin

from apps.core.admin_scoping import TeamScopedAdmin
from apps.scheduling.kick import kick_scheduler

from .models import TeamQuota, UsageRecord


@admin.register(UsageRecord)
class UsageRecordAdmin(TeamScopedAdmin, admin.ModelAdmin):
    list_display = ["job", "attempt", "team", "user", "priority_class", "gpu_seconds", "ended_at"]
    list_filter = ["team", "priority_class"]
    manager_can_change = False  # the ledger is written by the system only


@admin.register(TeamQuota)
class TeamQuotaAdmin(TeamScopedAdmin, admin.ModelAdmin):
    """Superusers set each team's limits and urgent allowance; managers read their teams' quotas.

    A manager who could edit these could raise their own team's GPU limit and urgent
    allowance (issue 9, finding 3), so the fields are superuser-only (rather than clamped
    to superuser-set ceilings: one number per limit, set by the people who own the pool).
    Every change is audited with before/after (``quota.change``, apps.accounts.admin_audit).
    """

    list_display = ["team", "max_gpus", "max_gpus_per_job", "user_gpu_hours_per_day",
                    "urgent_gpu_hours_per_day", "urgent_max_gpus", "updated_at"]
    manager_can_add = False
    manager_can_change = False
    audit_add_action = audit_change_action = "quota.change"

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        kick_scheduler()
