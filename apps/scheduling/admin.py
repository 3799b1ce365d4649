from django.contrib import admin, messages

from apps.core.admin_scoping import ChangedFieldsSaveAdmin, SuperuserEditAdmin

from .kick import kick_scheduler
from .models import SchedulerConfig


@admin.register(SchedulerConfig)
class SchedulerConfigAdmin(SuperuserEditAdmin, ChangedFieldsSaveAdmin, admin.ModelAdmin):
    """The one configuration row: weights, half-life, quotas, urgent defaults. Admins edit; managers read."""

    fieldsets = [
        ("Policy", {"fields": ["policy", "preemption", "preempt_min_runtime_s", "preempt_grace_s", "backfill",
                               "reservations", "size_preemption", "starving_preempt_window_hours", "bounded_wait",
                               "fragmentation_aware", "size_forgiveness_hours", "size_forgiveness_min_gpus",
                               "requeued_whole_node_first"]}),
        ("Priority weights (each factor is in [0, 1])",
         {"fields": ["weight_fairshare", "weight_age", "weight_size", "weight_class"]}),
        ("Fair-share and age", {"fields": ["half_life_hours", "age_cap_hours", "size_cap_gpu_hours"]}),
        ("Quotas (teams can override in Team quotas)",
         {"fields": ["user_gpu_hours_per_day", "max_gpus_per_job", "default_urgent_gpu_hours_per_day",
                     "default_urgent_max_gpus"]}),
    ]

    def has_add_permission(self, request, *args):
        return request.user.is_superuser and not SchedulerConfig.objects.exists()

    def has_delete_permission(self, request, obj=None):
        return False

    # Audited with before/after by apps.accounts.admin_audit, under this action name.
    audit_add_action = audit_change_action = "scheduler.config"

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        kick_scheduler()
        for said in obj.surprises():
            self.message_user(request, said, messages.WARNING)
