"""What a removal does to the team's channels (registered with :mod:`apps.core.departures`).

A team channel sends the team's job events to the target its creator gave — often their own
address or webhook. Once the creator is taken out of the team it would keep telling them about
the team's work, so the channels of the team they created are disabled, named to the person who
removed them; a manager re-enables one (its page) after checking where it points (sec22).
"""

from __future__ import annotations

from apps.core.departures import Departure, on_departure

from .models import Channel


def _created_by(*, user, team):
    return Channel.objects.filter(team=team, created_by=user, enabled=True).order_by("name")


def departure_preview(*, user, team) -> str | None:
    names = list(_created_by(user=user, team=team).values_list("name", flat=True))
    if not names:
        return None
    return (f"team channel{'s' if len(names) != 1 else ''} {user.get_username()} created will be disabled "
            f"({', '.join(names)})")


def departure_apply(*, user, team, by, why: str = "") -> Departure | None:
    channels = list(_created_by(user=user, team=team))
    if not channels:
        return None
    Channel.objects.filter(pk__in=[c.pk for c in channels]).update(enabled=False)
    names = ", ".join(c.name for c in channels)
    return Departure(message=f"Team channels {user.get_username()} created in {team.slug} disabled ({names}): "
                             "they may point at their own address; a manager may re-enable them",
                     data={"disabled_channels": [c.pk for c in channels]})


def register() -> None:
    on_departure(preview=departure_preview, apply=departure_apply)
