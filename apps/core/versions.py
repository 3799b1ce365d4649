"""Version numbers that are never issued twice (see :class:`apps.core.models.VersionCounter`)."""

from __future__ import annotations

from django.db.models import F
from django.db.models.functions import Greatest

from .models import VersionCounter


def version_next(*, kind: str, team, name: str, floor: int = 0) -> int:
    """Issue the next version number of (kind, team, name); call it inside the transaction that
    creates the row, so a failed create gives the number back. ``floor`` is the highest
    number already in use (rows made before the counter existed)."""
    counter, _ = VersionCounter.objects.get_or_create(kind=kind, team=team, name=name, defaults={"last": floor})
    VersionCounter.objects.filter(pk=counter.pk).update(last=Greatest(F("last"), floor) + 1)
    return VersionCounter.objects.values_list("last", flat=True).get(pk=counter.pk)
