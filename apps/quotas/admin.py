from django.contrib import admin

from apps.core.admin_scoping import TeamScopedAdmin
from apps.core.values import plain_value as plain
from apps.scheduling.kick import kick_scheduler

from .models import TeamQuota, UsageRecord


@admin.register(UsageRecord)
class UsageRecordAdmin(TeamScopedAdmin, admin.ModelAdmin):
    list_display = ["job", "attempt", "team", "user", "priority_class", "gpu_seconds", "ended_at"]
    list_filter = ["team", "priority_class"]
    manager_can_change = False  # the ledger is written by the system only


@admin.register(TeamQuota)
class TeamQuotaAdmin(TeamScopedAdmin, admin.ModelAdmin):
    """Managers set their teams' limits and urgent allowance; every change is audited."""

    list_display = ["team", "max_gpus", "max_gpus_per_job", "user_gpu_hours_per_day",
                    "urgent_gpu_hours_per_day", "urgent_max_gpus", "updated_at"]
    manager_can_add = True

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        from apps.accounts.services import audit_record

        audit_record(actor=request.user, action="quota.change", team=obj.team, target=obj,
                     message=f"quota of {obj.team} set by {request.user.username}",
                     data={field: plain(form.cleaned_data.get(field)) for field in form.changed_data})
        kick_scheduler()
