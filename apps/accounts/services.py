from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from apps.core.departures import departure_apply, departure_preview
from apps.core.errors import FieldErrors
from apps.core.prepared import PendingRow, PreparedInsert

from .live import access_changed
from .models import ApiToken, AuditEntry, Membership, StorageCharge, Team, hash_token

MAX_ACTIVE_TOKENS_PER_USER = 50
# Every submit writes one (apps/core/prepared.py): the INSERT compiled once per connection.
# AuditEntry.save() only refuses updates, so a new row may skip it (see the comment there).
AUDIT_INSERT = PreparedInsert(AuditEntry, save_guards_updates_only=True)


def operator_named(command: str) -> str:
    """The audit actor of an operator's ``manage.py`` command: who has the server's shell, not
    the user the command acts for (``issue_token alice`` is not alice making a token)."""
    return f"operator (manage.py {command})"


def actor_name(by) -> str:
    """Who acted, as a job's events name them: a user's name, or an operator's label (:func:`operator_named`)."""
    return by if isinstance(by, str) else by.get_username()


def audit_record(**entry: Any) -> AuditEntry:
    """Append one audit entry (the arguments are :func:`audit_prepare`'s)."""
    return audit_prepare(**entry).run()


def audit_prepare(
    *,
    actor,
    action: str,
    team: Team | int | None = None,
    target: Any = None,
    message: str = "",
    data: dict | None = None,
    target_id: str | None = None,
) -> PendingRow:
    """One audit entry, ``actor`` did ``action`` to ``target`` (in ``team``), ready to be
    appended by ``.run()`` (its values converted already: a submit prepares it before its
    transaction; apps/core/prepared.py).

    ``actor`` may be None for the system (scheduler, reaper), or a text naming who acted
    outside the site (:func:`operator_named`: an operator at the server's shell, acting for a
    user, is not that user); ``target`` any model
    instance (its class name and primary key are kept, not a foreign key, so the entry
    outlives it); ``target_id`` names the key a just-deleted target had.
    """
    actor_obj = actor if actor is not None and getattr(actor, "is_authenticated", False) else None
    team_id = team.pk if isinstance(team, Team) else team
    return AUDIT_INSERT.prepare(
        actor=actor_obj,
        actor_name=actor_obj.get_username() if actor_obj else actor[:150] if isinstance(actor, str) else "system",
        team_id=team_id,
        action=str(action),
        target_type=type(target).__name__.lower() if target is not None else "",
        target_id=str(target_id) if target_id is not None else
        str(target.pk) if target is not None and getattr(target, "pk", None) is not None else "",
        message=message[:500],
        data=data or {},
    )


def token_create(
    *, user, name: str = "default", ttl_days: int | None = None, by=None
) -> tuple[ApiToken, str]:
    """Create a token; returns the row and the plain key (never stored, shown once)."""
    key = ApiToken.new_key()
    token = ApiToken.objects.create(
        user=user,
        name=name,
        key_hash=hash_token(key),
        key_prefix=key[:10],
        expires_at=timezone.now() + timedelta(days=ttl_days) if ttl_days else None,
    )
    audit_record(actor=by or user, action=AuditEntry.Action.TOKEN_CREATE, target=token,
                 message=f"API token {name!r} ({token.key_prefix}…) for {user.get_username()}",
                 data={"user": user.get_username(), "name": name, "expires_at": str(token.expires_at or "")})
    return token, key


TOKEN_NAME = re.compile(r"[\w .:@+-]{1,100}")
TOKEN_MAX_DAYS = 3650


def token_issue(*, user, name: str, expires_in_days: int | None = None) -> tuple[ApiToken, str]:
    """The one way people create tokens (API and portal): the name rule, an expiry (default
    ``API_TOKEN_DEFAULT_DAYS``, at most 3650 days) and the cap on active tokens.
    Raises FieldErrors naming ``name`` or ``expires_in_days``. (``manage.py issue_token
    --no-expiry`` may still make a non-expiring token for automation, through :func:`token_create`.)"""
    errors = {}
    if not isinstance(name, str) or not TOKEN_NAME.fullmatch(name):  # fullmatch: no trailing newline
        errors["name"] = "must be 1-100 letters, digits, spaces or . _ - : @ +"
    days = settings.API_TOKEN_DEFAULT_DAYS if expires_in_days is None else expires_in_days
    if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= TOKEN_MAX_DAYS:
        errors["expires_in_days"] = f"must be a whole number of days between 1 and {TOKEN_MAX_DAYS}"
    if errors:
        raise FieldErrors(errors)
    active = sum(1 for token in ApiToken.objects.filter(user=user, revoked_at__isnull=True) if token.is_active)
    if active >= MAX_ACTIVE_TOKENS_PER_USER:
        raise FieldErrors({"name": f"you already have {active} active tokens (the limit is "
                                   f"{MAX_ACTIVE_TOKENS_PER_USER}); revoke one first"})
    return token_create(user=user, name=name, ttl_days=days)


def token_revoke(*, token: ApiToken, by=None) -> bool:
    """Revoke a token (idempotent). True if this call revoked it."""
    revoked = ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
    if revoked:
        token.refresh_from_db(fields=["revoked_at"])
        audit_record(actor=by or token.user, action=AuditEntry.Action.TOKEN_REVOKE, target=token,
                     message=f"API token {token.name!r} ({token.key_prefix}…) of {token.user.get_username()} revoked",
                     data={"user": token.user.get_username(), "name": token.name})
    return bool(revoked)


def team_ensure(*, slug: str, name: str | None = None) -> Team:
    team, _ = Team.objects.get_or_create(slug=slug, defaults={"name": name or slug.title()})
    return team


MANAGING_ROLES = (Membership.Role.MANAGER, Membership.Role.ADMIN)


TEAM_DATA_SHOWN = 3


def team_delete_refusal(team: Team) -> str | None:
    """Why ``team`` may not be deleted yet: it still owns dataset versions or registered model
    versions, named (the first few of each). Their rows are PROTECT on the team: the cascade took
    them and left their folders and weights files in storage, where nothing reaches or cleans them
    (left31). Each is deleted through its own service first (audited; its files and storage charge
    go; refused while an active job uses it). Jobs (PROTECT too) are listed by Django's own page.
    Reverse accessors, not imports: datasets and registry sit above this app."""
    parts = []
    for what, rows in (("dataset version", team.datasets.all()), ("model version", team.model_versions.all())):
        named = list(rows.order_by("name", "version").values_list("name", "version")[: TEAM_DATA_SHOWN + 1])
        if not named:
            continue
        count = rows.count() if len(named) > TEAM_DATA_SHOWN else len(named)
        shown = ", ".join(f"{team.slug}/{name}:v{version}" for name, version in named[:TEAM_DATA_SHOWN])
        parts.append(f"{count} {what}{'s' if count != 1 else ''} ({shown}{' …' if count > TEAM_DATA_SHOWN else ''})")
    if not parts:
        return None
    return f"{team.slug} still owns {' and '.join(parts)}: delete them first (their files go with them)"


def last_manager_error(*, membership: Membership, role: str | None = None) -> str | None:
    """Why ``membership`` may not become ``role`` (None: be removed), or None.

    A team keeps at least one active manager: without one nobody can set its channels,
    members or datasets, and a manager who demoted themselves landed on a bare 403
    (trial 14, F13). The message says whom to make manager first.
    """
    if membership.pk is None or role in MANAGING_ROLES:
        return None
    current = Membership.objects.filter(pk=membership.pk).select_related("user", "team").first()
    if current is None or current.role not in MANAGING_ROLES or not current.user.is_active:
        return None
    team = current.team
    others = Membership.objects.filter(team=team, user__is_active=True).exclude(pk=current.pk)
    if others.filter(role__in=MANAGING_ROLES).exists():
        return None
    candidates = sorted(others.values_list("user__username", flat=True))
    first = (f"make {' or '.join(candidates[:5])}{' (or another member)' if len(candidates) > 5 else ''} "
             f"its manager first" if candidates else "add another manager first")
    return f"{current.user.get_username()} is the last manager of {team.slug}; {first}"


def last_managers_error(*, memberships) -> list[str]:
    """Why removing ``memberships`` all at once would leave a team without an active manager: one
    sentence per team two or more of whose active managers are among them and none is left beside
    them (one alone is :func:`last_manager_error`'s). Each of them alone may go while the other
    stays: checked one by one, a "delete selected" of both took every manager (review31)."""
    ids = {m.pk for m in memberships if m.pk is not None}
    leaving: dict[Team, list[str]] = {}
    for membership in (Membership.objects.filter(pk__in=ids, role__in=MANAGING_ROLES, user__is_active=True)
                       .select_related("user", "team").order_by("team__slug", "user__username")):
        leaving.setdefault(membership.team, []).append(membership.user.get_username())
    refusals = []
    for team, names in leaving.items():
        others = Membership.objects.filter(team=team, user__is_active=True).exclude(pk__in=ids)
        if len(names) < 2 or others.filter(role__in=MANAGING_ROLES).exists():
            continue
        candidates = sorted(others.values_list("user__username", flat=True))
        first = (f"make {' or '.join(candidates[:5])}{' (or another member)' if len(candidates) > 5 else ''} "
                 f"its manager first" if candidates else "add another manager first")
        refusals.append(f"{', '.join(names[:-1])} and {names[-1]} are the last managers of {team.slug}; {first}")
    return refusals


def team_managers_lock(team_id: int) -> None:
    """Lock ``team_id``'s managing memberships until the transaction ends (call it in one).

    :func:`last_manager_error` reads whether another manager stays: two admins removing (or
    demoting) a team's last two managers at the same moment each read the other still there, and
    both went (fix31a). Every removal and demotion takes these locks first, in one order (by id):
    the second waits for the first, then reads it gone and is refused. (SQLite's IMMEDIATE
    transactions already serialise the writers; there this is a plain read.)

    Gotcha (review32): take them before any other membership row lock, and for several teams in
    team id order (the admin's move, an account's delete do): a row locked first, a removal beside it
    held the managers' rows below it and waited on that one, which waited on them, a deadlock on
    PostgreSQL. And anything that deletes memberships besides :func:`membership_remove` (an
    account's cascade) takes them and checks again under them (``DeactivatingUserAdmin``)."""
    list(Membership.objects.select_for_update().filter(team_id=team_id, role__in=MANAGING_ROLES)
         .order_by("pk").values_list("pk", flat=True))


def membership_set(*, user, team: Team, role: str, by=None) -> Membership:
    """Add ``user`` to ``team`` with ``role`` (or change the role); role changes are audited.

    Refused (:class:`FieldErrors` on ``role``) if it would leave the team without a manager.
    """
    with transaction.atomic():
        if role not in MANAGING_ROLES:
            team_managers_lock(team.pk)
        return _membership_set_locked(user=user, team=team, role=role, by=by)


def _membership_set_locked(*, user, team: Team, role: str, by) -> Membership:
    existing = Membership.objects.filter(user=user, team=team).first()
    if existing is not None and (refused := last_manager_error(membership=existing, role=role)):
        raise FieldErrors({"role": refused})
    previous = existing.role if existing is not None else None
    membership, _ = Membership.objects.update_or_create(user=user, team=team, defaults={"role": role})
    if role in MANAGING_ROLES and not user.is_staff:
        # Managers run their team from Django admin (scoped to it), which signs in staff only: one
        # made manager on a team's admin page was told "enter the correct username and password for
        # a staff account" (operator trial 20, F8); `manage.py team` did this itself.
        type(user).objects.filter(pk=user.pk).update(is_staff=True)
        user.is_staff = True
    if previous != role:
        audit_record(actor=by, action=AuditEntry.Action.ROLE_CHANGE, team=team, target=membership,
                     message=f"{user.get_username()}: {previous or 'not a member'} → {role} in {team.slug}",
                     data={"user": user.get_username(), "from": previous, "to": role})
    return membership


def membership_remove(*, membership: Membership, by=None) -> list[str]:
    """Take ``membership.user`` out of the team (audited); refused (:class:`FieldErrors` on
    ``role``) for its last manager.

    What the member leaves behind is dealt with in the same transaction (:mod:`apps.core.departures`:
    their queued jobs in the team are cancelled, naming who removed them); returns what was
    done, a sentence each, for the person who removed them."""
    user, team, role = membership.user, membership.team, membership.role
    target_id = membership.pk
    with transaction.atomic():
        team_managers_lock(membership.team_id)
        if refused := last_manager_error(membership=membership):
            raise FieldErrors({"role": refused})
        membership.delete()
        done = departure_apply(user=user, team=team, by=by)
        # Their open job sockets of this team close now (they re-check every few seconds anyway).
        transaction.on_commit(lambda: access_changed(user.pk))
        said = "; ".join(d.message for d in done)
        audit_record(actor=by, action=AuditEntry.Action.MEMBERSHIP_REMOVE, team=team, target=membership,
                     target_id=str(target_id),
                     message=(f"{user.get_username()} removed from {team.slug} (was {role})"
                              + (f": {said}" if said else ""))[:500],
                     data={"user": user.get_username(), "from": role, "to": None,
                           **{k: v for d in done for k, v in d.data.items()}})
    return [d.message for d in done]


def user_deactivated(*, user, by=None) -> list[str]:
    """What a deactivated account leaves behind, dealt with as a removal's is (:mod:`apps.core.departures`):
    in each of its teams its queued jobs and sweeps are cancelled (running ones left to finish),
    and a team it leaves without an active manager is named. Call it once the account is
    inactive: locking someone out is never refused for what they leave behind. Returns a
    sentence per thing done, for the person who deactivated them."""
    said: list[str] = []
    why = f"its owner {user.get_username()} was deactivated"
    for membership in Membership.objects.filter(user=user).select_related("team").order_by("team__slug"):
        team = membership.team
        said += [done.message for done in departure_apply(user=user, team=team, by=by, why=why)]
        if membership.role in MANAGING_ROLES and not Membership.objects.filter(
                team=team, role__in=MANAGING_ROLES, user__is_active=True).exists():
            said.append(f"No active manager left in {team.slug} ({user.get_username()} was its last): make one "
                        "of its members manager (admin, Teams), or nobody can manage its members and channels")
    return said


def membership_remove_preview(*, membership: Membership) -> list[str]:
    """What removing ``membership`` would do besides (its member's active jobs in the team), for a confirmation."""
    return departure_preview(user=membership.user, team=membership.team)


def user_ensure(*, username: str, password: str, superuser: bool = False):
    User = get_user_model()
    user, created = User.objects.get_or_create(username=username)
    user.is_staff = user.is_staff or superuser
    user.is_superuser = user.is_superuser or superuser
    user.set_password(password)
    user.save()
    return user


# --- storage quota (uploaded datasets and weights) ---------------------------------------------


class StorageQuotaExceeded(Exception):
    """The team's uploads would pass its storage quota; the message says by how much."""


def storage_quota_gb(team: Team) -> float:
    """The team's storage quota in GiB: its own, else the site's default (TEAM_STORAGE_QUOTA_GB)."""
    return float(team.storage_quota_gb if team.storage_quota_gb is not None else settings.TEAM_STORAGE_QUOTA_GB)


def storage_limit_bytes(team: Team) -> int:
    return int(storage_quota_gb(team) * 1024**3)


def storage_used_bytes(team: Team) -> int:
    return StorageCharge.objects.filter(team=team).aggregate(total=Sum("bytes"))["total"] or 0


def storage_reserve(*, team: Team, key: str, size: int) -> StorageCharge:
    """Charge ``size`` bytes for ``key`` to ``team``, or raise StorageQuotaExceeded.

    The team's row is locked (PostgreSQL; SQLite serialises writers anyway) while the sum
    is read and the charge inserted, so parallel uploads are counted one after the other.
    Call it before writing the files; :func:`storage_release` gives the bytes back.
    """
    with transaction.atomic():
        list(Team.objects.select_for_update().filter(pk=team.pk).values_list("pk", flat=True))
        used, limit = storage_used_bytes(team), storage_limit_bytes(team)
        if used + size > limit:
            raise StorageQuotaExceeded(
                f"team {team.slug} keeps {_gib(used)} of uploads; {_gib(size)} more would pass its storage quota "
                f"of {_gib(limit)}: delete old dataset versions or weights, or ask an admin for a larger quota")
        return StorageCharge.objects.create(team=team, key=key, bytes=size)


def storage_adjust(*, key: str, size: int, new_key: str | None = None) -> None:
    """Correct a charge once the real size is known, and move it to the artifact's final key."""
    StorageCharge.objects.filter(key=key).update(bytes=size, key=new_key or key)


def storage_release(*, key: str) -> None:
    StorageCharge.objects.filter(key=key).delete()


def _gib(size: int) -> str:
    """GiB from 10 MiB up; below, MiB, KiB or bytes, so a small upload is not "0.0 MiB"."""
    if size >= 1024**3 / 100:
        return f"{size / 1024**3:.2f} GiB"
    if size >= 1024**2 / 10:
        return f"{size / 1024**2:.1f} MiB"
    return f"{size / 1024:.1f} KiB" if size >= 1024 else f"{size} B"
