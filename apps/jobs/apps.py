from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "apps.jobs"
    label = "jobs"

    def ready(self) -> None:
        # Datasets and model versions that active jobs still need may not be deleted.
        from . import departures, guards

        guards.register()
        # A member taken out of a team leaves no queued job behind (apps/jobs/departures.py).
        departures.register()
