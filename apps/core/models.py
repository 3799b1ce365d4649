from __future__ import annotations

from django.conf import settings
from django.db import models


class VersionCounter(models.Model):
    """The last version number issued per (kind, team, name): "model", "dataset", ….

    A version number is never issued twice, also after its row was deleted (issue 9,
    finding 9): numbers come from this counter, not from the highest row left. It lives
    here, below the apps that version things (registry, datasets), and keeps the table
    the registry created for it.
    """

    kind = models.CharField(max_length=20)
    team = models.ForeignKey(settings.TEAM_MODEL, on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=200)
    last = models.PositiveIntegerField(default=0)

    class Meta:
        db_table = "registry_versioncounter"
        constraints = [models.UniqueConstraint(fields=["kind", "team", "name"], name="one_version_counter")]

    def __str__(self) -> str:
        return f"{self.kind} {self.team_id}/{self.name}: v{self.last}"


class StorageMark(models.Model):
    """This installation's storage id (one row, pk 1): what the marker file in each shared root
    holds (apps/core/storage_marks.py).

    The scheduler writes the markers; a GPU server (and the slurm_agent, and the Slurm relay)
    compares its own view of each root with this row, so the reference lives in the database,
    not on the storage being tested. ``written_at``: when the markers were first all in place;
    until then nobody checks for them (an installation upgraded before its scheduler ran).
    """

    token = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    written_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"storage mark {self.token}"
