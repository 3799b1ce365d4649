"""Writes: channels (personal, or a team's by its managers) and preferences."""

from __future__ import annotations

import apprise
from django.core.exceptions import ValidationError
from django.core.validators import URLValidator, validate_email

from apps.accounts.models import AuditEntry, Team
from apps.accounts.selectors import is_manager_of
from apps.accounts.services import audit_record
from apps.core.errors import FieldErrors

from .models import Channel, Event, NotificationPreference

PREFERENCE_FIELDS = ("on_succeeded", "on_failed", "on_timed_out", "on_preempted", "on_started_late",
                     "started_late_minutes", "on_quota_nearly_used", "quota_percent")


def target_error(kind: str, target: str) -> str | None:
    if kind == Channel.Kind.EMAIL:
        try:
            validate_email(target)
        except ValidationError:
            return "must be an email address"
    elif kind == Channel.Kind.WEBHOOK:
        try:
            URLValidator(schemes=["http", "https"])(target)
        except ValidationError:
            return "must be an http(s) URL"
    elif kind == Channel.Kind.APPRISE:
        if not apprise.Apprise().add(target):
            return "is not a URL apprise supports (e.g. slack://…, msteams://…, ntfy://…, mailto://…)"
    else:
        return f"kind must be one of {', '.join(Channel.Kind.values)}"
    from .senders import internal_address_error, target_hosts

    for host in target_hosts(kind, target):
        if problem := internal_address_error(host):
            return problem
    return None


def channel_create(*, by, name: str, kind: str, target: str, team: Team | None = None,
                   events: list[str] | None = None, started_late_minutes: int = 30) -> Channel:
    """A personal channel for ``by``, or (with ``team``) a team channel, which only its managers may set."""
    errors: dict[str, str] = {}
    if (problem := target_error(kind, target)) is not None:
        errors["kind" if problem.startswith("kind") else "target"] = problem
    if team is not None and not is_manager_of(user=by, team=team):
        errors["team"] = f"only managers of {team.slug} may set its channels"
    unknown = sorted(set(events or []) - set(Event.values))
    if unknown:
        errors["events"] = f"unknown event(s) {', '.join(unknown)}; choose from {', '.join(Event.values)}"
    elif team is not None and not events:
        errors["events"] = "a team channel needs at least one event"
    if errors:
        raise FieldErrors(errors)
    channel = Channel.objects.create(user=None if team else by, team=team, name=name, kind=kind, target=target,
                                     events=list(events or []), started_late_minutes=started_late_minutes,
                                     created_by=by)
    _channel_audit(channel, by, AuditEntry.Action.CHANNEL_CREATE, "created", channel.pk)
    return channel


def channel_delete(*, channel: Channel, by) -> None:
    """Delete a channel (audited; the caller checked :func:`channel_may_change`)."""
    target_id = channel.pk
    channel.delete()
    _channel_audit(channel, by, AuditEntry.Action.CHANNEL_DELETE, "deleted", target_id)


def _channel_audit(channel: Channel, by, action: str, done: str, target_id) -> None:
    # A team channel receives every team job's name, user, state and errors where it points:
    # its managers see who set one up and where it went (it was not audited: manager trial).
    # The target's host only: a webhook URL may carry its own secret (Slack's do).
    from .senders import target_hosts

    whose = f"team {channel.team.slug}" if channel.team_id else f"{by.get_username()}'s"
    hosts = ([channel.target] if channel.kind == Channel.Kind.EMAIL
             else sorted({host for host in target_hosts(channel.kind, channel.target) if host}))
    audit_record(actor=by, action=action, team=channel.team_id, target=channel, target_id=str(target_id),
                 message=f"{whose} {channel.kind} channel {channel.name!r} to {', '.join(hosts)} {done}",
                 data={"name": channel.name, "kind": channel.kind, "hosts": hosts, "events": channel.events})


def channel_may_change(*, channel: Channel, by) -> bool:
    if channel.user_id is not None:
        return channel.user_id == by.pk
    return is_manager_of(user=by, team=channel.team)


def preference_update(*, user, **fields) -> NotificationPreference:
    unknown = set(fields) - set(PREFERENCE_FIELDS)
    if unknown:
        raise FieldErrors({key: "is not a known preference" for key in sorted(unknown)})
    if "quota_percent" in fields and not 1 <= int(fields["quota_percent"]) <= 100:
        raise FieldErrors({"quota_percent": "must be between 1 and 100"})
    preference, _ = NotificationPreference.objects.get_or_create(user=user)
    for key, value in fields.items():
        setattr(preference, key, value)
    preference.save()
    return preference
