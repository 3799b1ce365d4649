from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    name = "apps.scheduling"
    label = "scheduling"

    def ready(self) -> None:
        from django.db.models.signals import post_delete, post_save

        from apps.accounts.models import Team
        from apps.cluster.models import GPU, Node
        from apps.quotas.models import TeamQuota

        from .admission import admission_inputs_changed
        from .models import SchedulerConfig

        # What submit's admission reads (apps.scheduling.admission): changed here, seen at once.
        for model in (Node, GPU, SchedulerConfig, TeamQuota, Team):
            post_save.connect(admission_inputs_changed, sender=model, dispatch_uid=f"admission-{model.__name__}")
            post_delete.connect(admission_inputs_changed, sender=model, dispatch_uid=f"admission-{model.__name__}-del")
