from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone


class Team(models.Model):
    slug = models.SlugField(unique=True)
    name = models.CharField(max_length=100)
    # Fair-share weight against sibling teams (Slurm "shares"). Above 0: the scheduler took 0 or
    # -2 for 1 without a word while admin showed what was typed (manager trial 15, F28).
    shares = models.FloatField(default=1.0, validators=[MinValueValidator(0.01)],
                               help_text="fair-share weight against the other teams (e.g. 2 = twice a team of 1's share)")
    # Uploaded datasets and weights together (StorageCharge); empty = settings.TEAM_STORAGE_QUOTA_GB.
    storage_quota_gb = models.FloatField(null=True, blank=True, validators=[MinValueValidator(0)],
                                         help_text="uploaded datasets and weights; empty = the site default")

    class UrgentBy(models.TextChoices):
        MEMBERS = "members", "every member"
        MANAGERS = "managers", "managers only"

    # The team's urgent allowance (TeamQuota) is spent by whoever submits urgent first: the
    # team's managers decide who may (manager trial F41). A superuser always may.
    urgent_by = models.CharField(
        "who may submit urgent jobs", max_length=10, choices=UrgentBy.choices, default=UrgentBy.MEMBERS,
        help_text="the team's urgent allowance is spent by whoever submits urgent jobs first; "
                  "with 'managers only' a member's urgent submit is refused (they may use high)")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    class Role(models.TextChoices):
        MEMBER = "member"
        MANAGER = "manager"
        ADMIN = "admin"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "team"], name="one_membership_per_team")]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"


class StorageCharge(models.Model):
    """Bytes a team keeps in storage for one uploaded artifact (a dataset version, a weights file).

    Written *before* the files are (``storage_reserve``, with the team's row locked), so two
    uploads at once cannot both squeeze under the quota; removed when the artifact is deleted
    or its upload fails. ``key`` is the artifact's key (apps/core/artifacts.py).
    """

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="storage_charges")
    key = models.CharField(max_length=500, unique=True)
    bytes = models.BigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["team__slug", "key"]

    def __str__(self) -> str:
        return f"{self.key}: {self.bytes} bytes"


def hash_token(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class ApiToken(models.Model):
    """An API token: only its SHA-256 is stored; the key is shown once at creation."""

    PREFIX = "yp_"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, default="default")
    key_hash = models.CharField(max_length=64, unique=True)
    key_prefix = models.CharField(max_length=12)  # first characters, to recognise a token in lists
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.key_prefix}… ({self.name}, {self.user})"

    @property
    def is_active(self) -> bool:
        if self.revoked_at:
            return False
        return self.expires_at is None or self.expires_at > timezone.now()

    @classmethod
    def new_key(cls) -> str:
        return cls.PREFIX + secrets.token_urlsafe(32)


class AuditEntryQuerySet(models.QuerySet):
    """Append-only: no bulk edits or deletes (issue 9, finding 2)."""

    def update(self, **kwargs):
        # The one update allowed: forgetting a deleted actor or team (their SET_NULL).
        if kwargs and set(kwargs) <= {"actor", "team"} and all(value is None for value in kwargs.values()):
            return super().update(**kwargs)
        raise PermissionError("audit entries are append-only: they cannot be changed")

    def delete(self):
        raise PermissionError("audit entries are append-only: they cannot be deleted")


class AuditEntry(models.Model):
    """Who did what, when: one row per security-relevant action (append-only).

    ``team`` is the team the action concerns (None for user-level actions such as
    creating an API token); managers read the entries of their teams. Rows refuse to be
    saved twice or deleted, in code (here) and in admin (view-only for everyone).
    """

    class Action(models.TextChoices):
        JOB_SUBMIT = "job.submit"
        JOB_CANCEL = "job.cancel"
        JOB_REQUEUE = "job.requeue"
        JOB_CLASS = "job.class"
        QUOTA_CHANGE = "quota.change"
        ROLE_CHANGE = "role.change"
        MEMBERSHIP_REMOVE = "membership.remove"
        TOKEN_CREATE = "token.create"
        TOKEN_REVOKE = "token.revoke"
        DATASET_UPLOAD = "dataset.upload"
        DATASET_DELETE = "dataset.delete"
        MODEL_PROMOTE = "model.promote"
        MODEL_DELETE = "model.delete"
        WEIGHTS_UPLOAD = "weights.upload"
        WEIGHTS_SHARED_ADD = "weights.shared_add"
        SCHEDULER_CONFIG = "scheduler.config"
        # A channel (a webhook or an address) that hears a team's or a user's job events.
        CHANNEL_CREATE = "channel.create"
        CHANNEL_DELETE = "channel.delete"
        CHANNEL_CHANGE = "channel.change"
        CHANNEL_TEST = "channel.test"
        # Every change made through Django admin (apps.accounts.admin_audit), with before/after.
        ADMIN_ADD = "admin.add"
        ADMIN_CHANGE = "admin.change"
        ADMIN_DELETE = "admin.delete"
        ADMIN_ACTION = "admin.action"

    objects = AuditEntryQuerySet.as_manager()

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="audit_entries")
    actor_name = models.CharField(max_length=150, blank=True, help_text="kept when the user is deleted")
    team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.SET_NULL, related_name="audit_entries")
    action = models.CharField(max_length=40, db_index=True)
    target_type = models.CharField(max_length=40, blank=True)
    target_id = models.CharField(max_length=64, blank=True)
    message = models.CharField(max_length=500, blank=True)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        verbose_name_plural = "audit entries"
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["team", "-created_at"])]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.actor_name} {self.action} {self.target_type}:{self.target_id}"

    def save(self, *args, **kwargs):
        # For a new row this is Model.save and nothing else: audit_record's prepared INSERT
        # (PreparedInsert(..., save_guards_updates_only=True)) relies on it. Keep it so, or
        # drop that flag there.
        if not self._state.adding:
            raise PermissionError("audit entries are append-only: they cannot be changed")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise PermissionError("audit entries are append-only: they cannot be deleted")
