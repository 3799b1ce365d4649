from django.apps import AppConfig


class NotificationsConfig(AppConfig):
    name = "apps.notifications"
    label = "notifications"
    verbose_name = "notifications"

    def ready(self) -> None:
        from . import departures

        # A member taken out of a team stops hearing its work through the team channels they made.
        departures.register()
