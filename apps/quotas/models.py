from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models


class UsageRecord(models.Model):
    """GPU-seconds one attempt of a job consumed; written when the attempt ends."""

    # The ledger outlives a deleted job (team, user and GPU-seconds stay; the charged totals and
    # usage reports never go down: a superuser's delete rewrote them, manager trial).
    job = models.ForeignKey("jobs.Job", null=True, blank=True, on_delete=models.SET_NULL, related_name="usage")
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
    # Validated (a superuser saved -1, 0 and -5 without a word; the scheduler then showed a
    # quota of -5 GPU-hours and refused every job: manager trial). 0 GPUs blocks the team on purpose.
    max_gpus = models.FloatField(verbose_name="max GPUs", null=True, blank=True, validators=[MinValueValidator(0)],
                                 help_text="GPUs the team may hold at once; empty = no limit; 0 = none")
    max_gpus_per_job = models.FloatField(verbose_name="max GPUs per job",
                                         null=True, blank=True, validators=[MinValueValidator(0.01)],
                                         help_text="GPUs one job may ask for; empty = no limit")
    user_gpu_hours_per_day = models.FloatField(verbose_name="user GPU-hours per day",
                                               null=True, blank=True, validators=[MinValueValidator(0)],
                                               help_text="per member, rolling 24 h; empty = the global default")
    urgent_gpu_hours_per_day = models.FloatField(verbose_name="urgent GPU-hours per day",
                                                 null=True, blank=True, validators=[MinValueValidator(0)],
                                                 help_text="urgent allowance; beyond it urgent jobs run as high")
    urgent_max_gpus = models.FloatField(verbose_name="urgent max GPUs",
                                        null=True, blank=True, validators=[MinValueValidator(0)],
                                        help_text="GPUs the team may hold as urgent at once (at most max GPUs)")
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"quota of {self.team}"

    def clean(self) -> None:
        if self.max_gpus is not None and self.urgent_max_gpus is not None and self.urgent_max_gpus > self.max_gpus:
            raise ValidationError({"urgent_max_gpus": f"may not exceed max GPUs ({self.max_gpus:g}): urgent jobs "
                                                      f"count against the team's GPUs too"})
        if self.max_gpus is not None and self.max_gpus_per_job is not None and self.max_gpus_per_job > self.max_gpus > 0:
            raise ValidationError({"max_gpus_per_job": f"may not exceed max GPUs ({self.max_gpus:g}): such a job "
                                                       f"could never start"})


class UsageReport(UsageRecord):
    """Admin's "usage report" page (apps/quotas/admin.py): the ledger summed per team or user."""

    class Meta:
        proxy = True
        verbose_name = "usage report"
        verbose_name_plural = "usage report"
