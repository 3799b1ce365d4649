from __future__ import annotations

from django.contrib import admin

from .models import Channel, Delivery, NotificationPreference


@admin.register(Channel)
class ChannelAdmin(admin.ModelAdmin):
    """Superusers see every channel here; managers set their teams' channels through the
    portal or the API (which check that they manage the team)."""

    list_display = ("name", "kind", "team", "user", "enabled", "created_at")
    list_filter = ("kind", "enabled", "team")
    exclude = ("secret",)

    def has_module_permission(self, request):
        return request.user.is_superuser

    has_view_permission = has_change_permission = has_add_permission = has_delete_permission = (
        lambda self, request, obj=None: request.user.is_superuser)


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    list_display = ("created_at", "event", "channel", "state", "attempts", "response_status", "sent_at")
    list_filter = ("state", "event")
    readonly_fields = [f.name for f in Delivery._meta.fields]

    def has_module_permission(self, request):
        return request.user.is_superuser

    def has_view_permission(self, request, obj=None):
        return request.user.is_superuser

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(NotificationPreference)
class NotificationPreferenceAdmin(admin.ModelAdmin):
    list_display = ("user", "on_succeeded", "on_failed", "on_timed_out", "on_preempted", "on_started_late",
                    "on_quota_nearly_used")

    def has_module_permission(self, request):
        return request.user.is_superuser

    has_view_permission = has_change_permission = has_add_permission = has_delete_permission = (
        lambda self, request, obj=None: request.user.is_superuser)
