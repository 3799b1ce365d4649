"""``/healthz`` and ``/readyz`` for load balancers and orchestrators (Kubernetes probes).

- ``GET /healthz``: the process answers (liveness); touches nothing else.
- ``GET /readyz``: the database answers ``SELECT 1`` and has no migration left to apply, and
  Redis a ``PING`` (readiness: a web process that lost either would answer every request with
  an error); 503 naming which is down (``"database": "not migrated"``: run ``manage.py migrate``).

Answered by a middleware placed first, before the host check and the HTTPS redirect: a
kubelet probes the pod's IP over plain HTTP, which ``ALLOWED_HOSTS`` and ``SECURE=true``
would refuse (the probes were bare TCP checks for that reason, so a web pod whose database
or Redis was gone stayed "ready": manager trial). They say "ok"/"down" and nothing else;
the reason is logged.
"""

from __future__ import annotations

import logging

import redis
from django.conf import settings
from django.db import connection
from django.http import JsonResponse

from apps.core.migrated import NOT_MIGRATED, database_migrated
from apps.core.redis_outage import redis_reachable, redis_use_failed

log = logging.getLogger("yoloportal.health")

PATHS = ("/healthz", "/readyz")


def _database() -> str:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            if cursor.fetchone() != (1,):
                return "down"
        if not database_migrated():  # tables missing: every request would be a 500 (trial M7)
            log.warning("readyz: %s", NOT_MIGRATED)
            return "not migrated"
        return "ok"
    except Exception as exc:  # noqa: BLE001 - any failure means "not ready"; the reason is logged
        log.warning("readyz: database down: %s", exc)
        return "down"


def _redis() -> bool:
    # A connection of its own, short timeouts: what a new request would meet, not a pooled one.
    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
    try:
        answered = bool(client.ping())
    except redis.RedisError as exc:
        # Unreachable: one line per process and outage (apps/core/redis_outage.py), not one per probe.
        if not redis_use_failed(exc):
            log.warning("readyz: redis down: %s", exc)
        return False
    finally:
        client.close()
    redis_reachable()
    return answered


class HealthMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.path not in PATHS:
            return self.get_response(request)
        if request.method not in ("GET", "HEAD"):
            return JsonResponse({"detail": "GET only"}, status=405)
        if request.path == "/healthz":
            return JsonResponse({"status": "ok"})
        checks = {"database": _database(), "redis": "ok" if _redis() else "down"}
        ready = all(v == "ok" for v in checks.values())
        body = {"status": "ok" if ready else "down", **checks}
        return JsonResponse(body, status=200 if ready else 503)
