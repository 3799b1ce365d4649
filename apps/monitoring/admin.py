from __future__ import annotations

from django.contrib import admin

from apps.core.admin_scoping import SuperuserRecordsAdmin

from .models import UtilisationHour


@admin.register(UtilisationHour)
class UtilisationHourAdmin(SuperuserRecordsAdmin, admin.ModelAdmin):
    """The cluster's hourly history, read-only (superusers: it spans every team)."""

    list_display = ("hour", "samples", "mean_gpus", "allocation_pct", "utilisation_pct", "mean_running",
                    "mean_queued")
    date_hierarchy = "hour"

    @admin.display(description="GPUs")
    def mean_gpus(self, obj):
        return f"{obj.mean('gpu_sum'):.1f}"

    @admin.display(description="allocation")
    def allocation_pct(self, obj):
        return f"{obj.allocation:.0%}"

    @admin.display(description="utilisation")
    def utilisation_pct(self, obj):
        return f"{obj.utilisation:.0%}"

    @admin.display(description="running jobs")
    def mean_running(self, obj):
        return f"{obj.mean('running_jobs_sum'):.1f}"

    @admin.display(description="queued jobs")
    def mean_queued(self, obj):
        return f"{obj.mean('queued_jobs_sum'):.1f}"

    def has_delete_permission(self, request, obj=None):
        return False
