from __future__ import annotations

from django.contrib import admin

from apps.core.admin_scoping import SuperuserOnlyAdmin, SuperuserRecordsAdmin

from .models import Channel, Delivery, NotificationPreference


@admin.register(Channel)
class ChannelAdmin(SuperuserOnlyAdmin, admin.ModelAdmin):
    """Superusers see every channel here; managers set their teams' channels through the
    portal or the API (which check that they manage the team)."""

    list_display = ("name", "kind", "team", "user", "enabled", "created_at")
    list_filter = ("kind", "enabled", "team")
    exclude = ("secret",)


@admin.register(Delivery)
class DeliveryAdmin(SuperuserRecordsAdmin, admin.ModelAdmin):
    list_display = ("created_at", "event", "channel", "state", "attempts", "response_status", "sent_at")
    list_filter = ("state", "event")
    readonly_fields = [f.name for f in Delivery._meta.fields]


@admin.register(NotificationPreference)
class NotificationPreferenceAdmin(SuperuserOnlyAdmin, admin.ModelAdmin):
    list_display = ("user", "on_succeeded", "on_failed", "on_timed_out", "on_preempted", "on_started_late",
                    "on_quota_nearly_used")
