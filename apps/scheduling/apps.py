from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    name = "apps.scheduling"
    label = "scheduling"

    def ready(self) -> None:
        from django.db.models.signals import post_delete, post_save

        from apps.accounts.models import Team
        from apps.cluster.models import GPU, Node
        from apps.quotas.models import TeamQuota

        from .admission import admission_cache_clear
        from .models import SchedulerConfig

        # What submit's admission reads (apps.scheduling.admission): changed here, seen at once.
        for model in (Node, GPU, SchedulerConfig, TeamQuota, Team):
            post_save.connect(admission_cache_clear, sender=model, dispatch_uid=f"admission-{model.__name__}")
            post_delete.connect(admission_cache_clear, sender=model, dispatch_uid=f"admission-{model.__name__}-del")
