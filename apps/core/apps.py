from django.apps import AppConfig


class CoreConfig(AppConfig):
    """Pieces every app builds on. It imports no other app (tests/test_architecture.py checks)."""

    name = "apps.core"
    label = "core"
