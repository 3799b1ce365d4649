"""The notifications page: my preferences, my channels and my teams' (as a manager), the log."""

from __future__ import annotations

import math

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render

from apps.accounts.selectors import manager_team_list
from apps.accounts.throttles import ChannelTestThrottle, throttle_wait
from apps.core.buttons import button_only
from apps.core.errors import FieldErrors
from apps.core.selectors import get_or_404

from .models import Channel, Event, NotificationPreference
from .selectors import channel_list, delivery_list
from .services import (
    PREFERENCE_FIELDS,
    channel_create,
    channel_delete,
    channel_disabled_note,
    channel_may_change,
    channel_test,
    channel_update,
    mail_not_configured,
    preference_update,
)

BOOLEAN_PREFERENCES = [f for f in PREFERENCE_FIELDS if f.startswith("on_")]


@login_required
def notifications(request):
    errors: dict[str, str] = {}
    secret = None
    # A refused form comes back as it was typed (its values were replaced by the saved ones, or
    # emptied: new-user trial 20).
    typed_preferences: dict | None = None
    typed_channel: dict = {}
    if request.method == "POST" and request.POST.get("action") == "preferences":
        try:
            values = {f: f in request.POST for f in BOOLEAN_PREFERENCES}
            # Each box that is no whole number is named (it said "preferences: minutes and percent
            # must be whole numbers", whichever it was: trial25).
            not_whole = {}
            for field, default in (("started_late_minutes", 30), ("quota_percent", 80)):
                typed = request.POST.get(field) or str(default)
                try:
                    values[field] = int(typed)
                except ValueError:
                    not_whole[field] = f"must be a whole number, got {typed[:20]!r}"
            if not_whole:
                raise FieldErrors(not_whole)
            preference_update(user=request.user, **values)
            messages.success(request, "Preferences saved.")
            return redirect("notifications")
        except ValueError as exc:
            errors = getattr(exc, "errors", {"preferences": "minutes and percent must be whole numbers"})
            typed_preferences = {**{f: f in request.POST for f in BOOLEAN_PREFERENCES},
                                 **{f: request.POST.get(f, "")[:20] for f in ("started_late_minutes", "quota_percent")}}
    elif request.method == "POST" and request.POST.get("action") == "channel":
        team = manager_team_list(user=request.user).filter(slug=request.POST.get("team", "")).first()
        if request.POST.get("team") and team is None:
            errors = {"team": "you do not manage that team"}
        else:
            try:
                channel = channel_create(by=request.user, name=request.POST.get("name", "")[:100],
                                         kind=request.POST.get("kind", ""), target=request.POST.get("target", ""),
                                         team=team, events=request.POST.getlist("events"))
                secret = channel.secret if channel.kind == Channel.Kind.WEBHOOK else None
                messages.success(request, f"Channel {channel.name} added.")
                if warning := mail_not_configured(channel):
                    messages.warning(request, warning)
            except FieldErrors as exc:
                errors = exc.errors
        if errors:
            typed_channel = {"name": request.POST.get("name", "")[:100], "kind": request.POST.get("kind", ""),
                             "target": request.POST.get("target", "")[:1000], "team": request.POST.get("team", ""),
                             "events": request.POST.getlist("events")}
    preference = NotificationPreference.objects.filter(user=request.user).first() or \
        NotificationPreference(user=request.user)
    shown = typed_preferences or {f: getattr(preference, f) for f in PREFERENCE_FIELDS}
    channels = list(channel_list(user=request.user))
    for channel in channels:  # beside each email channel while the server has no mail (manager trial 15, F15)
        channel.warning = mail_not_configured(channel)
    return render(request, "portal/notifications.html", {
        "preference": shown, "typed_channel": typed_channel, "channels": channels, "errors": errors,
        "deliveries": delivery_list(user=request.user)[:50], "managed_teams": manager_team_list(user=request.user),
        "kinds": Channel.Kind.choices, "events": Event.choices, "new_secret": secret,
        "flags": [(f, shown[f], f.removeprefix("on_").replace("_", " ")) for f in BOOLEAN_PREFERENCES],
    })


def changeable(request, pk: int) -> Channel | None:
    channel = get_or_404(channel_list(user=request.user), pk, "No such channel.")
    if not channel_may_change(channel=channel, by=request.user):
        messages.error(request, f"Only the owner of {channel.name} or its team's managers may change it.")
        return None
    return channel


@login_required
@button_only("notifications")
def channel_delete_view(request, pk: int):
    if channel := changeable(request, pk):
        channel_delete(channel=channel, by=request.user)  # audited, as through the API
        messages.success(request, f"Channel {channel.name} removed.")
    return redirect("notifications")


@login_required
@button_only("notifications")
def channel_enable_view(request, pk: int):
    # The state the button asked for, not a toggle: a stale page or a double click did the
    # opposite of the button's label (manager trial 15, F14).
    wanted = {"1": True, "0": False}.get(request.POST.get("enabled", ""))
    if wanted is None:
        messages.error(request, "enabled: must be 1 (enable) or 0 (disable).")
    elif channel := changeable(request, pk):
        before = channel.enabled
        channel = channel_update(channel=channel, by=request.user, enabled=wanted)
        state = "enabled" if channel.enabled else "disabled"
        messages.success(request, f"Channel {channel.name} {state}." if before != wanted
                         else f"Channel {channel.name} was already {state}; nothing changed.")
    return redirect("notifications")


@login_required
@button_only("notifications")
def channel_test_view(request, pk: int):
    wait = throttle_wait(ChannelTestThrottle(), request)
    if wait is not None:
        messages.error(request, f"Too many test messages (the limit is {ChannelTestThrottle().get_rate()} per user, "
                                f"as in the API): try again in {math.ceil(wait)} s.")
    elif channel := changeable(request, pk):
        delivery = channel_test(channel=channel, by=request.user)
        if delivery.state == delivery.State.SENT:
            messages.success(request, f"Test message delivered to {channel.name}.")
        else:
            messages.error(request, f"Test message to {channel.name} failed: {delivery.last_error}")
        if note := channel_disabled_note(channel):
            messages.warning(request, f"{channel.name}: {note}.")
    return redirect("notifications")
