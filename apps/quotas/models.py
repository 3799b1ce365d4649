from __future__ import annotations

from django.conf import settings
from django.db import models


class UsageRecord(models.Model):
    """GPU-seconds one attempt of a job consumed; written when the attempt ends."""

    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="usage")
    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="usage")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="usage")
    attempt = models.PositiveIntegerField()
    priority_class = models.CharField(max_length=10)
    gpu_seconds = models.FloatField()
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["-ended_at"]
        constraints = [models.UniqueConstraint(fields=["job", "attempt"], name="one_usage_record_per_attempt")]


class TeamQuota(models.Model):
    """Limits a team's managers set; empty fields fall back to the scheduler configuration."""

    team = models.OneToOneField("accounts.Team", on_delete=models.CASCADE, related_name="quota")
    max_gpus = models.FloatField(null=True, blank=True, help_text="GPUs the team may hold at once; empty = no limit")
    max_gpus_per_job = models.FloatField(null=True, blank=True)
    user_gpu_hours_per_day = models.FloatField(null=True, blank=True,
                                               help_text="per member, rolling 24 h; empty = the global default")
    urgent_gpu_hours_per_day = models.FloatField(null=True, blank=True,
                                                 help_text="urgent allowance; beyond it urgent jobs run as high")
    urgent_max_gpus = models.FloatField(null=True, blank=True, help_text="GPUs the team may hold as urgent at once")
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"quota of {self.team}"


class UsageReport(UsageRecord):
    """Admin's "usage report" page (apps/quotas/admin.py): the ledger summed per team or user."""

    class Meta:
        proxy = True
        verbose_name = "usage report"
        verbose_name_plural = "usage report"
