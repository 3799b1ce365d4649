from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "apps.jobs"
    label = "jobs"

    def ready(self) -> None:
        # Datasets and model versions that active jobs still need may not be deleted.
        from .guards import register

        register()
