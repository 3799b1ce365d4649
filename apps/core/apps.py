from django.apps import AppConfig


class CoreConfig(AppConfig):
    """Pieces every app builds on. It imports no other app (tests/test_architecture.py checks)."""

    name = "apps.core"
    label = "core"

    def ready(self) -> None:
        from django.urls import register_converter

        from .converters import AnyCaseUUIDConverter

        # Before any URLconf is read: a path() compiles its converters when it is made.
        register_converter(AnyCaseUUIDConverter, "any_uuid")
