from __future__ import annotations

from django.db import models


class ModelVersion(models.Model):
    """Trained weights from a succeeded job, versioned per (team, name)."""

    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="model_versions")
    name = models.CharField(max_length=200)
    version = models.PositiveIntegerField()
    job = models.OneToOneField("jobs.Job", on_delete=models.SET_NULL, null=True, related_name="model_version")
    weights_path = models.CharField(max_length=500)
    sha256 = models.CharField(max_length=64, blank=True)
    size = models.BigIntegerField(default=0)
    metrics = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["team__slug", "name", "-version"]
        constraints = [models.UniqueConstraint(fields=["team", "name", "version"], name="unique_model_version")]

    def __str__(self) -> str:
        return f"{self.team.slug}/{self.name}:v{self.version}"


class VersionCounter(models.Model):
    """The last version number issued per (kind, team, name).

    A version number is never issued twice, also after its row was deleted (issue 9,
    finding 9): numbers come from this counter, not from the highest row left.
    ``kind`` is "model" for :class:`ModelVersion`; other versioned things take their own.
    """

    kind = models.CharField(max_length=20)
    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=200)
    last = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["kind", "team", "name"], name="one_version_counter")]

    def __str__(self) -> str:
        return f"{self.kind} {self.team_id}/{self.name}: v{self.last}"
