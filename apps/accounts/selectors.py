"""Who may see what. Every read of team-owned data goes through these."""

from __future__ import annotations

from django.db.models import QuerySet

from .models import Membership, Team


def team_list(*, user) -> QuerySet[Team]:
    """Teams the user belongs to (all teams for a superuser)."""
    if not user.is_authenticated:
        return Team.objects.none()
    if user.is_superuser:
        return Team.objects.all()
    return Team.objects.filter(memberships__user=user).distinct()


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
