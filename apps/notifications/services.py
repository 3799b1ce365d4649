"""Writes: channels (personal, or a team's by its managers) and preferences."""

from __future__ import annotations

import uuid

import apprise
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import URLValidator, validate_email

from apps.accounts.models import AuditEntry, Team
from apps.accounts.selectors import is_manager_of
from apps.accounts.services import audit_record
from apps.core.errors import FieldErrors

from .models import TEST_EVENT, Channel, Delivery, Event, NotificationPreference

PREFERENCE_FIELDS = ("on_succeeded", "on_failed", "on_timed_out", "on_preempted", "on_started_late",
                     "started_late_minutes", "on_quota_nearly_used", "quota_percent", "on_cancelled",
                     "on_sweep_trials")


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
    from .senders import target_address_error

    return target_address_error(kind, target)


# A personal channel hears what its owner's preferences choose: events and lateness set on it were
# stored and never read (manager trial 15, F13).
TEAM_CHANNEL_ONLY = {
    "events": "a personal channel sends what your notification preferences choose (notifications/preferences/); "
              "events are for team channels",
    "started_late_minutes": "a personal channel uses your preferences' lateness (notifications/preferences/); "
                            "this field is for team channels",
}


def personal_errors(given: list[str]) -> dict[str, str]:
    """The team-channel-only fields given for a personal channel, each named."""
    return {name: TEAM_CHANNEL_ONLY[name] for name in given if name in TEAM_CHANNEL_ONLY}


def channel_create(*, by, name: str, kind: str, target: str, team: Team | None = None,
                   events: list[str] | None = None, started_late_minutes: int | None = None) -> Channel:
    """A personal channel for ``by``, or (with ``team``) a team channel, which only its managers may
    set (``events`` and ``started_late_minutes``: team channels only; a late start is 30 minutes
    unless given)."""
    errors: dict[str, str] = {}
    if not name.strip():
        # The portal named it "channel" and said "Channel channel added." (manager trial 15, F15).
        errors["name"] = "must not be blank: name the channel (e.g. my phone, team chat)"
    if team is None:
        errors.update(personal_errors([name for name, value in (("events", events),
                                                                ("started_late_minutes", started_late_minutes))
                                       if value]))
    if (problem := target_error(kind, target)) is not None:
        errors["kind" if problem.startswith("kind") else "target"] = problem
    if team is not None and not is_manager_of(user=by, team=team):
        errors["team"] = f"only managers of {team.slug} may set its channels"
    if problem := events_error(team, events):
        errors["events"] = problem
    if errors:
        raise FieldErrors(errors)
    channel = Channel.objects.create(user=None if team else by, team=team, name=name, kind=kind, target=target,
                                     events=list(events or []),
                                     started_late_minutes=30 if started_late_minutes is None else started_late_minutes,
                                     created_by=by)
    _channel_audit(channel, by, AuditEntry.Action.CHANNEL_CREATE, "created", channel.pk)
    return channel


def mail_not_configured(channel: Channel) -> str | None:
    """For an email channel on a server where no operator named a mail server: what that means."""
    if channel.kind != Channel.Kind.EMAIL or settings.NOTIFY_SMTP_CONFIGURED:
        return None
    return (f"mail is not configured on this server (NOTIFY_SMTP_HOST is unset): mail goes to "
            f"{settings.NOTIFY_SMTP_HOST}:{settings.NOTIFY_SMTP_PORT}, where it arrives only if a mail server "
            f"runs there; send a test message to see, and ask the operator to set NOTIFY_SMTP_HOST")


def channel_disabled_note(channel: Channel) -> str | None:
    """Beside a test's answer: a disabled channel took the test but hears no job's events (the
    answer said nothing of it: manager trial 15, F15)."""
    if channel.enabled:
        return None
    return "the channel is disabled: the test was sent, but job events are not sent to it until it is enabled"


def events_error(team: Team | None, events: list[str] | None) -> str | None:
    unknown = sorted(set(events or []) - set(Event.values))
    if unknown:
        return f"unknown event(s) {', '.join(unknown)}; choose from {', '.join(Event.values)}"
    if team is not None and not events:
        return "a team channel needs at least one event"
    return None


CHANGEABLE = ("name", "enabled", "events", "started_late_minutes")


def channel_update(*, channel: Channel, by, **fields) -> Channel:
    """Rename, enable or disable a channel, or change a team channel's events (the caller checked
    :func:`channel_may_change`); audited with what changed. Its kind, target and secret stay: a
    new target is a new channel (manager trial F20: edit was delete and create again)."""
    unknown = sorted(set(fields) - set(CHANGEABLE))
    if unknown:
        raise FieldErrors({key: "cannot be changed: delete the channel and create another" for key in unknown})
    if "name" in fields and not str(fields["name"]).strip():
        raise FieldErrors({"name": "must not be blank"})
    if channel.team_id is None and (errors := personal_errors(list(fields))):
        raise FieldErrors(errors)
    if "events" in fields and (problem := events_error(channel.team, fields["events"])):
        raise FieldErrors({"events": problem})
    changes = {key: {"from": getattr(channel, key), "to": value} for key, value in fields.items()
               if getattr(channel, key) != value}
    if not changes:
        return channel
    Channel.objects.filter(pk=channel.pk).update(**{key: change["to"] for key, change in changes.items()})
    channel.refresh_from_db()
    what = ", ".join(f"{key} {change['from']!r} → {change['to']!r}" for key, change in changes.items())
    _channel_audit(channel, by, AuditEntry.Action.CHANNEL_CHANGE, f"changed ({what})", channel.pk,
                   changes=changes)
    return channel


def channel_test(*, channel: Channel, by) -> Delivery:
    """Send one test message to the channel now, through the sender every delivery uses, and record
    it in the delivery log (event ``test``): sent, or failed with the error. Not retried: the
    caller is waiting for the answer (manager trial F20: a channel could not be tried)."""
    from django.utils import timezone

    from .senders import send

    whose = f"team {channel.team.slug}'s" if channel.team_id else "your"
    payload = {"event": TEST_EVENT,
               "message": f"test message from yoloportal to {whose} channel {channel.name!r}, "
                          f"sent by {by.get_username()}"}
    if settings.PORTAL_URL:
        payload["url"] = settings.PORTAL_URL.rstrip("/") + "/notifications/"
    delivery = Delivery.objects.create(channel=channel, event=TEST_EVENT, job=None, cause=f"test:{uuid.uuid4()}",
                                       payload=payload, attempts=1)
    try:
        status = send(delivery)
    except Exception as exc:  # noqa: BLE001 - whatever the sender raised is the answer, as a delivery records it
        error = str(exc)
        if (warning := mail_not_configured(channel)) is not None:
            # Not in parentheses: the sender's error already ends in some (manager trial 15, F15).
            error = f"{error}; {warning.split(' (')[0]}: NOTIFY_SMTP_HOST is unset"
        Delivery.objects.filter(pk=delivery.pk).update(state=Delivery.State.FAILED, last_error=error[:2000],
                                                       response_status=getattr(exc, "status", None))
    else:
        Delivery.objects.filter(pk=delivery.pk).update(state=Delivery.State.SENT, sent_at=timezone.now(),
                                                       response_status=status)
    delivery.refresh_from_db()
    _channel_audit(channel, by, AuditEntry.Action.CHANNEL_TEST, f"tested: {delivery.state}", channel.pk)
    return delivery


def channel_delete(*, channel: Channel, by) -> None:
    """Delete a channel (audited; the caller checked :func:`channel_may_change`)."""
    target_id = channel.pk
    channel.delete()
    _channel_audit(channel, by, AuditEntry.Action.CHANNEL_DELETE, "deleted", target_id)


def _channel_audit(channel: Channel, by, action: str, done: str, target_id, **extra) -> None:
    # A team channel receives every team job's name, user, state and errors where it points:
    # its managers see who set one up and where it went (it was not audited: manager trial).
    # The target's host only: a webhook URL may carry its own secret (Slack's do).
    from .senders import target_hosts

    whose = f"team {channel.team.slug}" if channel.team_id else f"{by.get_username()}'s"
    hosts = ([channel.target] if channel.kind == Channel.Kind.EMAIL
             else sorted({host for host in target_hosts(channel.kind, channel.target) if host}))
    audit_record(actor=by, action=action, team=channel.team_id, target=channel, target_id=str(target_id),
                 message=f"{whose} {channel.kind} channel {channel.name!r} to {', '.join(hosts)} {done}",
                 data={"name": channel.name, "kind": channel.kind, "hosts": hosts, "events": channel.events,
                       **extra})


def channel_may_change(*, channel: Channel, by) -> bool:
    if channel.user_id is not None:
        return channel.user_id == by.pk
    return is_manager_of(user=by, team=channel.team)


LATE_MINUTES_MAX = 100000


def preference_update(*, user, **fields) -> NotificationPreference:
    unknown = set(fields) - set(PREFERENCE_FIELDS)
    if unknown:
        raise FieldErrors({key: "is not a known preference" for key in sorted(unknown)})
    errors: dict[str, str] = {}
    # The API's own bounds (api.py): the page wrote any whole number, and past the column's integers,
    # or below 0, the database refused it with a 500 (sec19, F9).
    if "started_late_minutes" in fields and not 1 <= int(fields["started_late_minutes"]) <= LATE_MINUTES_MAX:
        errors["started_late_minutes"] = f"must be between 1 and {LATE_MINUTES_MAX} minutes"
    if "quota_percent" in fields and not 1 <= int(fields["quota_percent"]) <= 100:
        errors["quota_percent"] = "must be between 1 and 100"
    if errors:  # both at once: the page named one, then the other after a second try (trial 20)
        raise FieldErrors(errors)
    preference, _ = NotificationPreference.objects.get_or_create(user=user)
    for key, value in fields.items():
        setattr(preference, key, value)
    preference.save()
    return preference
