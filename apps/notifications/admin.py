from __future__ import annotations

import math

from django import forms
from django.contrib import admin, messages

from apps.accounts.throttles import ChannelTestThrottle, throttle_wait
from apps.core.admin_scoping import SuperuserOnlyAdmin, SuperuserRecordsAdmin

from .models import Channel, Delivery, NotificationPreference
from .services import (
    TEAM_CHANNEL_ONLY,
    channel_disabled_note,
    channel_test,
    events_error,
    personal_errors,
    target_error,
)


class ChannelAdminForm(forms.ModelForm):
    """The checks the API makes, each naming its field: the form saved ``not-an-email`` as an email
    target, and a channel with both a user and a team answered the database constraint's name
    (manager trial 15, F16)."""

    class Meta:
        model = Channel
        exclude = ("secret",)

    def clean(self):
        data = super().clean()
        user, team = data.get("user"), data.get("team")
        if user is not None and team is not None:
            self.add_error("team", "a channel is either a user's or a team's, not both: "
                                   "clear user (a team channel) or team (a personal channel)")
        elif user is None and team is None and not {"user", "team"} & set(self.errors):
            self.add_error("user", "a channel is either a user's or a team's: choose a user or a team")
        if "kind" in data and "target" in data and (problem := target_error(data["kind"], data["target"])):
            self.add_error("kind" if problem.startswith("kind") else "target", problem)
        if user is not None and team is None:
            # A personal channel hears what its owner's preferences choose (TEAM_CHANNEL_ONLY);
            # lateness only when changed here, since the column always holds a value.
            given = [name for name in TEAM_CHANNEL_ONLY
                     if name in data and name in self.changed_data and data[name]]
            for name, problem in personal_errors(given).items():
                self.add_error(name, problem)
        elif team is not None and "events" in data:
            if not isinstance(data["events"], list):
                self.add_error("events", f"must be a list of events, e.g. [\"failed\"], got {data['events']!r}")
            elif problem := events_error(team, data["events"]):
                self.add_error("events", problem)
        return data


@admin.register(Channel)
class ChannelAdmin(SuperuserOnlyAdmin, admin.ModelAdmin):
    """Superusers see every channel here; managers set their teams' channels through the
    portal or the API (which check that they manage the team)."""

    list_display = ("name", "kind", "team", "user", "enabled", "created_at")
    list_filter = ("kind", "enabled", "team")
    form = ChannelAdminForm
    actions = ["send_test"]
    # Who made the channel is not a choice: the form asked for it, required, with every account
    # listed (operator trial 20, F7). The one who saves it here, as the API and the portal record.
    readonly_fields = ("created_by",)

    def save_model(self, request, obj, form, change):
        if not change:
            obj.created_by = request.user
        super().save_model(request, obj, form, change)
        # The secret comes from the model's default and the form never shows it: a webhook made
        # here could not be verified by its receiver. Shown once, as the portal and the API do.
        if obj.kind == Channel.Kind.WEBHOOK and (not change or "kind" in form.changed_data):
            self.message_user(request, f"webhook signing secret of {obj.name}, shown once: {obj.secret} (the "
                                       "receiver checks X-Yoloportal-Signature: sha256=HMAC(secret, timestamp + "
                                       "\".\" + raw body); docs/notifications.md)", messages.WARNING)

    @admin.action(description="Send a test message (through the real sender; says what happened)")
    def send_test(self, request, queryset):
        channels = list(queryset.select_related("team"))
        for sent, channel in enumerate(channels):
            # One counter with the API and the portal's Test button: each message is a mail or an
            # HTTP request sent now, and a select-all on a long list would send hundreds at once.
            wait = throttle_wait(ChannelTestThrottle(), request)
            if wait is not None:
                self.message_user(request, f"Too many test messages (the limit is {ChannelTestThrottle().get_rate()} "
                                           f"per user, as in the API): sent {sent} of {len(channels)}; try the rest "
                                           f"again in {math.ceil(wait)} s.", messages.ERROR)
                return
            delivery = channel_test(channel=channel, by=request.user)
            if delivery.state == Delivery.State.SENT:
                self.message_user(request, f"test message delivered to {channel}", messages.SUCCESS)
            else:
                self.message_user(request, f"test message to {channel} failed: {delivery.last_error}", messages.ERROR)
            if note := channel_disabled_note(channel):
                self.message_user(request, f"{channel}: {note}", messages.WARNING)


@admin.register(Delivery)
class DeliveryAdmin(SuperuserRecordsAdmin, admin.ModelAdmin):
    list_display = ("created_at", "event", "channel", "state", "attempts", "response_status", "sent_at")
    list_filter = ("state", "event")
    readonly_fields = [f.name for f in Delivery._meta.fields]


@admin.register(NotificationPreference)
class NotificationPreferenceAdmin(SuperuserOnlyAdmin, admin.ModelAdmin):
    list_display = ("user", "on_succeeded", "on_failed", "on_timed_out", "on_preempted", "on_started_late",
                    "on_quota_nearly_used")
