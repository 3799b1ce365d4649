from django.contrib import admin, messages

from apps.core.admin_scoping import TeamScopedAdmin, UnseenAsMissing
from apps.scheduling.kick import kick_scheduler

from .models import TeamQuota, UsageRecord, UsageReport
from .selectors import team_quota_warnings


@admin.register(UsageRecord)
class UsageRecordAdmin(TeamScopedAdmin, admin.ModelAdmin):
    list_display = ["job", "attempt", "team", "user", "priority_class", "gpu_seconds", "ended_at"]
    list_select_related = ["job", "team", "user"]  # job is nullable: Django's own skips it (trial30b)
    list_filter = ["team", "priority_class"]
    manager_can_change = False  # the ledger is written by the system only

    def has_add_permission(self, request, *args):
        return False  # superusers too: a hand-made record charged hours no attempt ran (operator trial 20, F1)


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
    readonly_fields = ["in_force"]

    @admin.display(description="in force now")
    def in_force(self, quota: TeamQuota) -> str:
        """Each limit the scheduler applies, and whether this row or the site default (the
        scheduler configuration) sets it: an empty field read only "-" (manager trial F36)."""
        from apps.scheduling.inputs import team_policies
        from apps.scheduling.models import SchedulerConfig
        from apps.scheduling.standing import TEAM_OVERRIDE, limits_in_force

        config = SchedulerConfig.current().to_policy()
        # The Teams page's own figures; a row not saved yet has the site defaults only.
        policy = team_policies(config)[quota.team.slug] if quota.pk else config.default_team
        limits = limits_in_force(config=config, policy=policy, override=quota if quota.pk else None)
        shown = [f"{TeamQuota._meta.get_field(name).verbose_name}: "
                 f"{'no limit' if limit['value'] is None else format(limit['value'], 'g')} "
                 f"({'this team' if limit['source'] == TEAM_OVERRIDE else 'site default'})"
                 for name, limit in limits.items()]
        return " · ".join(shown) + ". Use against them: the portal's Teams page."

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        kick_scheduler()
        for said in team_quota_warnings(quota=obj):
            self.message_user(request, said, messages.WARNING)


@admin.register(UsageReport)
class UsageReportAdmin(UnseenAsMissing, admin.ModelAdmin):
    """Per team or per user over a period (?from=&to=&group=), scoped like the API's report:
    managers see their teams and their members' usage charged to them; superusers all."""

    def has_module_permission(self, request):
        return request.user.is_active and request.user.is_staff

    def has_view_permission(self, request, obj=None):
        return request.user.is_active and request.user.is_staff

    def get_queryset(self, request):
        # Only the report page is meant to be used; a row opened by id is still team-scoped.
        from apps.accounts.selectors import managed_team_ids

        rows = super().get_queryset(request)
        return rows if request.user.is_superuser else rows.filter(team_id__in=managed_team_ids(user=request.user))

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def changelist_view(self, request, extra_context=None):
        from django.template.response import TemplateResponse
        from django.utils import timezone

        from .reports import GROUPS, columns, report_for_page

        page = report_for_page(request.GET, user=request.user, now=timezone.now())
        group, start, end, rows, errors = page.group, page.start, page.end, page.rows, page.errors
        context = {**self.admin_site.each_context(request), "title": "Usage report", "opts": self.model._meta,
                   "rows": rows, "columns": columns(group)[1:], "group": group, "groups": GROUPS, "errors": errors,
                   "start": start, "end": end, "from_value": timezone.localdate(start).isoformat(),
                   "to_value": timezone.localdate(end).isoformat(), "team": page.team}
        return TemplateResponse(request, "admin/quotas/usage_report.html", context)
