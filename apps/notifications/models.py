"""Who is told what: per-user preferences, channels (personal or per team), and the delivery log."""

from __future__ import annotations

import secrets

from django.conf import settings
from django.db import models


class Event(models.TextChoices):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    PREEMPTED = "preempted"
    STARTED_LATE = "started_late", "started after a long wait"
    QUOTA_NEARLY_USED = "quota_nearly_used", "quota nearly used"
    CANCELLED = "cancelled", "cancelled by someone else"


TEST_EVENT = "test"


def new_secret() -> str:
    return "whsec_" + secrets.token_urlsafe(32)


class NotificationPreference(models.Model):
    """What a user wants to hear about their own jobs (on their personal channels)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                                related_name="notification_preference")
    on_succeeded = models.BooleanField(default=True)
    on_failed = models.BooleanField(default=True)
    on_timed_out = models.BooleanField(default=True)
    on_preempted = models.BooleanField(default=False)
    on_started_late = models.BooleanField(default=False, help_text="a job started after waiting longer than")
    started_late_minutes = models.PositiveIntegerField(default=30)
    on_quota_nearly_used = models.BooleanField(default=False)
    quota_percent = models.PositiveSmallIntegerField(default=80, help_text="of the rolling 24 h GPU quota")
    on_cancelled = models.BooleanField(default=True, help_text="a job cancelled by someone else (a manager, an "
                                                               "operator, a removal from the team)")
    on_sweep_trials = models.BooleanField(default=False, help_text="each trial of a sweep as its own job (the "
                                                                   "sweep's own message carries their summary)")
    updated_at = models.DateTimeField(auto_now=True)

    def wants(self, event: str) -> bool:
        return bool(getattr(self, f"on_{event}", False))

    def __str__(self) -> str:
        return f"notification preferences of {self.user}"


class Channel(models.Model):
    """Where messages go. Personal (``user``) channels carry the user's own jobs as their
    preferences say; team channels, set by the team's managers, carry that team's jobs."""

    class Kind(models.TextChoices):
        EMAIL = "email", "email"
        WEBHOOK = "webhook", "webhook (JSON, HMAC-SHA256 signed)"
        APPRISE = "apprise", "apprise URL (Slack, Teams, Matrix, ntfy, …)"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE,
                             related_name="notification_channels")
    team = models.ForeignKey("accounts.Team", null=True, blank=True, on_delete=models.CASCADE,
                             related_name="notification_channels")
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=10, choices=Kind.choices)
    target = models.CharField(max_length=1000, help_text="email address, webhook URL or apprise URL")
    secret = models.CharField(max_length=100, default=new_secret, help_text="signs webhook bodies")
    events = models.JSONField(default=list, blank=True, help_text="team channels: the events to send")
    started_late_minutes = models.PositiveIntegerField(default=30, help_text="team channels: what counts as late")
    enabled = models.BooleanField(default=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["team__slug", "name"]
        constraints = [
            models.CheckConstraint(condition=models.Q(user__isnull=True) ^ models.Q(team__isnull=True),
                                   name="channel_is_personal_or_team")
        ]

    def __str__(self) -> str:
        owner = f"team {self.team}" if self.team_id else f"user {self.user}"
        return f"{self.name} ({self.kind}, {owner})"


class Delivery(models.Model):
    """One message to one channel, with every try recorded. Visible to the channel's owner."""

    class State(models.TextChoices):
        PENDING = "pending"
        SENT = "sent"
        FAILED = "failed"  # gave up after the last retry

    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="deliveries")
    # Besides the events a channel may hear: "test", a message its owner asked for (channel_test).
    event = models.CharField(max_length=20, choices=[*Event.choices, (TEST_EVENT, "test message")])
    job = models.ForeignKey("jobs.Job", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # What caused it (a JobEvent id, or "quota:<user>:<day>"): the same cause never sends twice.
    cause = models.CharField(max_length=100)
    payload = models.JSONField(default=dict)
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING, db_index=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    last_error = models.TextField(blank=True)
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name_plural = "deliveries"
        constraints = [models.UniqueConstraint(fields=["channel", "cause"], name="one_delivery_per_cause")]

    @property
    def task_name(self) -> str:
        """The job it was about, by name: the job's, or what the message said once the job is gone
        (the log named no job, only a UUID in the API: trial 16, G19)."""
        if self.job is not None:
            return self.job.task_name
        return str((self.payload or {}).get("job", {}).get("task_name") or "")

    def __str__(self) -> str:
        return f"{self.event} → {self.channel} ({self.state})"
