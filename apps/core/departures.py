"""What a person leaves behind in a team they are taken out of: the accounts app (below) asks
the apps above it, without importing them (as :mod:`apps.core.guards` does for deletes).

A member removed while their jobs waited in the team's queue left jobs that would still run,
charged to a team they had left, which they could no longer see or cancel (trial 14, F40).
``apps.jobs`` registers what it does about that (its ``AppConfig.ready``); the removal
(``apps.accounts.services.membership_remove``) shows :func:`departure_preview` before and
applies :func:`departure_apply` in its own transaction.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

Preview = Callable[..., "str | None"]


@dataclass
class Departure:
    """What one hook did: a sentence for the person who removed the member, and audit data."""

    message: str
    data: dict = field(default_factory=dict)


_PREVIEWS: list[Callable[..., str | None]] = []
_APPLIES: list[Callable[..., Departure | None]] = []


def on_departure(*, preview: Callable[..., str | None], apply: Callable[..., Departure | None]) -> None:
    """Register ``preview(user=, team=)`` → what removing ``user`` from ``team`` will do (None: nothing),
    and ``apply(user=, team=, by=, why=)`` → what it did."""
    _PREVIEWS.append(preview)
    _APPLIES.append(apply)


def departure_preview(*, user, team) -> list[str]:
    return [text for check in _PREVIEWS if (text := check(user=user, team=team))]


def departure_apply(*, user, team, by, why: str = "") -> list[Departure]:
    """``why``: the reason the jobs left behind are given (default: the member was removed from ``team``)."""
    return [done for apply in _APPLIES if (done := apply(user=user, team=team, by=by, why=why))]
