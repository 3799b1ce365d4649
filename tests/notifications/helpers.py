from __future__ import annotations

import redis
from django.conf import settings
from rq import Queue, SimpleWorker

from apps.notifications.hooks import QUEUE


def run_notifications() -> None:
    """Drain the notifications queue in this process with RQ's own (non-forking) worker, so it
    sees the test's database transaction. Retries with interval 0 are requeued at once."""
    connection = redis.Redis.from_url(settings.REDIS_URL)
    SimpleWorker([Queue(QUEUE, connection=connection)], connection=connection).work(burst=True)
