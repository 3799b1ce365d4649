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
