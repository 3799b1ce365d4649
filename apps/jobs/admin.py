from django.contrib import admin, messages

from apps.core.admin_scoping import TeamScopedAdmin, TeamScopedInline
from apps.scheduling.kick import kick_scheduler

from .models import Checkpoint, Job, JobEvent, JobState, LogChunk, MetricPoint
from .services import job_cancel, job_class_set, job_requeue


class JobEventInline(TeamScopedInline, admin.TabularInline):
    model = JobEvent
    extra = 0
    can_delete = False
    team_field = "job__team"
    parent_team_field = "team"
    manager_can_change = False
    readonly_fields = ["seq", "attempt", "kind", "message", "created_at"]
    fields = readonly_fields


@admin.register(Job)
class JobAdmin(TeamScopedAdmin, admin.ModelAdmin):
    list_display = ["task_name", "state", "team", "user", "priority_class", "gpus", "node", "attempt",
                    "queue_position", "estimated_start_at", "priority_score", "created_at"]
    list_filter = ["state", "priority_class", "team"]
    search_fields = ["task_name", "id", "user__username"]
    readonly_fields = ["id", "state", "attempt", "attempt_id", "node", "gpu_indices", "gpu_share", "created_at",
                       "queued_at", "dispatched_at", "started_at", "finished_at", "heartbeat_at",
                       "queue_position", "estimated_start_at", "predicted_start_at", "reason", "priority_score",
                       "priority_factors", "spec", "raw_spec", "spec_hash", "weights_path", "error", "seq"]
    inlines = [JobEventInline]
    superuser_only_fields = ("team", "user")
    # Managers look and act through the actions (cancel, requeue, class), which go through
    # the services; they never edit a job's fields: shrinking `gpus` of a running job would
    # undercharge its usage (issue 9, finding 2). Superusers' edits are audited.
    manager_can_change = False
    actions = ["cancel", "requeue", "make_low", "make_medium", "make_high", "make_urgent"]

    def get_exclude(self, request, obj=None):
        # The stored spec and weights path hold absolute server paths: managers see the public spec.
        excluded = list(super().get_exclude(request, obj) or [])
        return excluded if request.user.is_superuser else [*excluded, "spec", "weights_path"]

    def get_readonly_fields(self, request, obj=None):
        fields = list(super().get_readonly_fields(request, obj))
        if not request.user.is_superuser:
            fields = [f for f in fields if f not in ("spec", "weights_path")] + ["public_spec"]
        return fields

    @admin.display(description="spec")
    def public_spec(self, job: Job) -> str:
        import json

        return json.dumps(job.public_spec, indent=2)

    @admin.action(description="Cancel selected jobs")
    def cancel(self, request, queryset):
        done = sum(job_cancel(job=job, by=request.user) for job in queryset)
        self.message_user(request, f"cancel requested for {done} job(s)")

    @admin.action(description="Requeue selected running jobs (resume from checkpoint)")
    def requeue(self, request, queryset):
        done = sum(job_requeue(job, reason=f"requeued by {request.user.username}", kind="requeued",
                               by=request.user)
                   for job in queryset)
        self.message_user(request, f"requeued {done} job(s)")

    def _set_class(self, request, queryset, cls):
        for job in queryset.filter(state=JobState.QUEUED):
            job_class_set(job, priority_class=cls, by=request.user)
        kick_scheduler()
        self.message_user(request, f"queued jobs set to {cls}", messages.SUCCESS)

    @admin.action(description="Set class: low")
    def make_low(self, request, queryset):
        self._set_class(request, queryset, "low")

    @admin.action(description="Set class: medium")
    def make_medium(self, request, queryset):
        self._set_class(request, queryset, "medium")

    @admin.action(description="Set class: high")
    def make_high(self, request, queryset):
        self._set_class(request, queryset, "high")

    @admin.action(description="Set class: urgent")
    def make_urgent(self, request, queryset):
        self._set_class(request, queryset, "urgent")


@admin.register(JobEvent)
class JobEventAdmin(TeamScopedAdmin, admin.ModelAdmin):
    list_display = ["job", "seq", "attempt", "kind", "message", "created_at"]
    list_filter = ["kind"]
    team_field = "job__team"
    manager_can_change = False


@admin.register(MetricPoint)
class MetricPointAdmin(TeamScopedAdmin, admin.ModelAdmin):
    list_display = ["job", "epoch", "attempt", "seq", "created_at"]
    team_field = "job__team"
    manager_can_change = False


@admin.register(LogChunk)
class LogChunkAdmin(TeamScopedAdmin, admin.ModelAdmin):
    list_display = ["job", "seq", "attempt", "created_at"]
    team_field = "job__team"
    manager_can_change = False


@admin.register(Checkpoint)
class CheckpointAdmin(TeamScopedAdmin, admin.ModelAdmin):
    list_display = ["job", "attempt", "epoch", "size", "created_at"]
    team_field = "job__team"
    manager_can_change = False
