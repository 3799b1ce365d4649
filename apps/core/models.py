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
