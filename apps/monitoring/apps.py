from django.apps import AppConfig


class MonitoringConfig(AppConfig):
    name = "apps.monitoring"
    label = "monitoring"
    verbose_name = "monitoring"

    def ready(self) -> None:
        from . import checks  # noqa: F401 - registers the METRICS_TOKEN deployment check
