"""Who may see what. Every read of team-owned data goes through these."""

from __future__ import annotations

from typing import Any

from django.db.models import Q, QuerySet

from apps.core.prepared import PreparedRead
from apps.core.selectors import scoped_get

from .models import ApiToken, AuditEntry, Membership, Team


def team_list(*, user) -> QuerySet[Team]:
    """Teams the user belongs to (all teams for a superuser)."""
    if not user.is_authenticated:
        return Team.objects.none()
    if user.is_superuser:
        return Team.objects.all()
    return Team.objects.filter(memberships__user=user).distinct()


_MEMBER_TEAMS = PreparedRead(lambda user_id: Team.objects.filter(memberships__user_id=user_id).distinct(),
                             samples=({"user_id": 1}, {"user_id": 2}))


def team_rows(*, user) -> list[Team]:
    """:func:`team_list` as a list, its SQL compiled once per connection (submit's hot path)."""
    if user.is_authenticated and not user.is_superuser:
        return _MEMBER_TEAMS(user_id=user.pk)
    return list(team_list(user=user))


def team_rows_ahead(*, user) -> list[tuple[PreparedRead, dict[str, Any]]]:
    """The prepared read :func:`team_rows` makes for ``user`` (none for a superuser's), so a submit
    can read it ahead with its other reads (``apps.core.prepared.reads_ahead``)."""
    return [(_MEMBER_TEAMS, {"user_id": user.pk})] if user.is_authenticated and not user.is_superuser else []


def team_for_upload(*, user, slug: str | None) -> Team:
    """The team an upload is for: the named one the user is in, else their only team.

    Raises FieldErrors naming ``team`` when the user is not in it, or is in several (or none)."""
    from apps.core.errors import FieldErrors

    teams = list(team_list(user=user))
    if slug:
        team = next((t for t in teams if t.slug == slug), None)
        if team is None:
            raise FieldErrors({"team": f"you are not a member of a team named {slug!r}"})
        return team
    if len(teams) == 1:
        return teams[0]
    raise FieldErrors({"team": "is required: you are in several teams (or none)"})


def team_filter(*, user, slug: str | None, managed: bool = False) -> Team | None:
    """The team a ``?team=`` filter names, if the caller is in it (manages it, with ``managed``).

    A name the caller may not read is refused, never an empty page: an empty page read like
    "no data", and a filter that was ignored showed the caller's own team as if it were the
    named one (trial 14, F32). One message for a team that does not exist and one of others,
    so the answer does not tell which names exist. Raises FieldErrors naming ``team``."""
    from apps.core.errors import FieldErrors

    if not slug:
        return None
    teams = manager_team_list(user=user) if managed else team_list(user=user)
    team = teams.filter(slug=slug).first()
    if team is None:
        role = "a manager" if managed else "a member"
        raise FieldErrors({"team": f"you are not {role} of a team named {slug!r}"})
    return team


def member_filter(*, user, username: str | None):
    """The user a ``?user=`` filter names, if they are in one of the caller's teams; else a
    FieldErrors naming ``user`` (one message whether the name exists or not, as team_filter)."""
    from django.contrib.auth import get_user_model

    from apps.core.errors import FieldErrors

    if not username:
        return None
    member = get_user_model().objects.filter(username=username,
                                             memberships__team__in=team_list(user=user)).first()
    if member is None:
        raise FieldErrors({"user": f"no member of your teams is named {username!r}"})
    return member


def team_ids(*, user) -> list[int]:
    return list(team_list(user=user).values_list("id", flat=True))


def role_in(*, user, team: Team) -> str | None:
    if user.is_superuser:
        return Membership.Role.ADMIN
    return Membership.objects.filter(user=user, team=team).values_list("role", flat=True).first()


def is_manager_of(*, user, team: Team) -> bool:
    return role_in(user=user, team=team) in {Membership.Role.MANAGER, Membership.Role.ADMIN}


def managed_team_ids(*, user) -> list[int]:
    if user.is_superuser:
        return list(Team.objects.values_list("id", flat=True))
    return list(
        Membership.objects.filter(
            user=user, role__in=[Membership.Role.MANAGER, Membership.Role.ADMIN]
        ).values_list("team_id", flat=True)
    )


def manager_team_list(*, user) -> QuerySet[Team]:
    if not user.is_authenticated:
        return Team.objects.none()
    return Team.objects.filter(id__in=managed_team_ids(user=user))


def audit_list(*, user, team: str | None = None, action: str | None = None) -> QuerySet[AuditEntry]:
    """Audit entries the caller may read: every entry of the teams they manage (all for an
    admin), plus their own user-level entries (their tokens)."""
    if not user.is_authenticated:
        return AuditEntry.objects.none()
    if user.is_superuser:
        entries = AuditEntry.objects.all()
    else:
        entries = AuditEntry.objects.filter(
            Q(team_id__in=managed_team_ids(user=user)) | Q(team__isnull=True, actor=user)
        )
    if team:
        entries = entries.filter(team__slug=team)
    if action:
        entries = entries.filter(action=action)
    return entries.select_related("team")


def token_list(*, user) -> QuerySet[ApiToken]:
    """The caller's own API tokens (never anyone else's, not even for an admin)."""
    if not user.is_authenticated:
        return ApiToken.objects.none()
    return ApiToken.objects.filter(user=user)


def token_get(*, user, pk) -> ApiToken | None:
    return scoped_get(token_list(user=user), pk)
