"""GET /metrics: Prometheus text, behind a bearer token (METRICS_TOKEN)."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .collector import registry


def token_error(request: HttpRequest) -> HttpResponse | None:
    """None when the caller may scrape; otherwise the response that says why not.

    With ``METRICS_TOKEN`` set, ``Authorization: Bearer <token>`` is required. Without it,
    /metrics answers anonymous callers only with ``METRICS_OPEN=true`` (``make run``; DEBUG's
    default), and never under ``SECURE=true``.
    """
    expected = settings.METRICS_TOKEN
    if not expected:
        if settings.SECURE:
            return HttpResponse("/metrics is disabled: SECURE=true requires METRICS_TOKEN to be set.\n",
                                status=403, content_type="text/plain")
        if not settings.METRICS_OPEN:
            return HttpResponse("/metrics is disabled: set METRICS_TOKEN and give Prometheus the same value as its "
                                "bearer token (or METRICS_OPEN=true where only the operator reaches this port).\n",
                                status=403, content_type="text/plain")
        return None
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given:
        response = HttpResponse("Authorization: Bearer <METRICS_TOKEN> is required.\n", status=401,
                                content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    if not hmac.compare_digest(given.strip().encode(), expected.encode()):
        return HttpResponse("Authorization: the bearer token is not METRICS_TOKEN.\n", status=403,
                            content_type="text/plain")
    return None


@never_cache
@require_GET
def prometheus_metrics(request: HttpRequest) -> HttpResponse:
    refused = token_error(request)
    if refused is not None:
        return refused
    # Each running job's id, team and losses only to the token's holder (the operator's Prometheus).
    per_job = bool(settings.METRICS_TOKEN)
    return HttpResponse(generate_latest(registry(per_job=per_job)), content_type=CONTENT_TYPE_LATEST)
