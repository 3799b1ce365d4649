from __future__ import annotations

from django.conf import settings
from django.core.checks import Warning, register


@register(deploy=True)
def metrics_token_check(app_configs, **kwargs):
    if settings.METRICS_TOKEN:
        return []
    hint = "Set METRICS_TOKEN and give Prometheus the same value as its bearer token."
    if settings.SECURE:
        return [Warning("SECURE=true without METRICS_TOKEN: /metrics answers 403 until a token is set.",
                        hint=hint, id="yoloportal.W013")]
    if settings.METRICS_OPEN and not settings.DEBUG:
        return [Warning("METRICS_OPEN=true without METRICS_TOKEN: anyone who reaches the port can scrape /metrics.",
                        hint=hint, id="yoloportal.W014")]
    return []
