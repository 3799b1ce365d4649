from django.apps import AppConfig


class SweepsConfig(AppConfig):
    name = "apps.sweeps"
    label = "sweeps"
    verbose_name = "Hyperparameter sweeps"
