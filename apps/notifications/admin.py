from __future__ import annotations

from django.contrib import admin, messages

from apps.core.admin_scoping import SuperuserOnlyAdmin, SuperuserRecordsAdmin

from .models import Channel, Delivery, NotificationPreference
from .services import channel_test


@admin.register(Channel)
class ChannelAdmin(SuperuserOnlyAdmin, admin.ModelAdmin):
    """Superusers see every channel here; managers set their teams' channels through the
    portal or the API (which check that they manage the team)."""

    list_display = ("name", "kind", "team", "user", "enabled", "created_at")
    list_filter = ("kind", "enabled", "team")
    exclude = ("secret",)
    actions = ["send_test"]

    @admin.action(description="Send a test message (through the real sender; says what happened)")
    def send_test(self, request, queryset):
        for channel in queryset.select_related("team"):
            delivery = channel_test(channel=channel, by=request.user)
            if delivery.state == Delivery.State.SENT:
                self.message_user(request, f"test message delivered to {channel}", messages.SUCCESS)
            else:
                self.message_user(request, f"test message to {channel} failed: {delivery.last_error}", messages.ERROR)


@admin.register(Delivery)
class DeliveryAdmin(SuperuserRecordsAdmin, admin.ModelAdmin):
    list_display = ("created_at", "event", "channel", "state", "attempts", "response_status", "sent_at")
    list_filter = ("state", "event")
    readonly_fields = [f.name for f in Delivery._meta.fields]


@admin.register(NotificationPreference)
class NotificationPreferenceAdmin(SuperuserOnlyAdmin, admin.ModelAdmin):
    list_display = ("user", "on_succeeded", "on_failed", "on_timed_out", "on_preempted", "on_started_late",
                    "on_quota_nearly_used")
