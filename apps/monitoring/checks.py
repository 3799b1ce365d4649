from __future__ import annotations

from django.conf import settings
from django.core.checks import Warning, register


@register(deploy=True)
def metrics_token_check(app_configs, **kwargs):
    if settings.SECURE and not settings.METRICS_TOKEN:
        return [Warning("SECURE=true without METRICS_TOKEN: /metrics answers 403 until a token is set.",
                        hint="Set METRICS_TOKEN and give Prometheus the same value as its bearer token.",
                        id="yoloportal.W013")]
    return []
