from __future__ import annotations

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.utils import timezone

from .models import ApiToken, Membership, Team, hash_token


def token_create(*, user, name: str = "default", ttl_days: int | None = None) -> tuple[ApiToken, str]:
    """Create a token; returns the row and the plain key (never stored)."""
    key = ApiToken.new_key()
    token = ApiToken.objects.create(
        user=user,
        name=name,
        key_hash=hash_token(key),
        key_prefix=key[:10],
        expires_at=timezone.now() + timedelta(days=ttl_days) if ttl_days else None,
    )
    return token, key


def token_revoke(*, token: ApiToken) -> None:
    ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())


def team_ensure(*, slug: str, name: str | None = None) -> Team:
    team, _ = Team.objects.get_or_create(slug=slug, defaults={"name": name or slug.title()})
    return team


def membership_set(*, user, team: Team, role: str) -> Membership:
    membership, _ = Membership.objects.update_or_create(user=user, team=team, defaults={"role": role})
    return membership


def user_ensure(*, username: str, password: str, superuser: bool = False):
    User = get_user_model()
    user, created = User.objects.get_or_create(username=username)
    user.is_staff = user.is_staff or superuser
    user.is_superuser = user.is_superuser or superuser
    user.set_password(password)
    user.save()
    return user
