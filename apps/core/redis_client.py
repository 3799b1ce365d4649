"""The process's one Redis connection (kicks, queues, leases); created on first use."""

from __future__ import annotations

import redis
from django.conf import settings

_client: redis.Redis | None = None


def redis_client() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5, socket_connect_timeout=2)
    return _client
