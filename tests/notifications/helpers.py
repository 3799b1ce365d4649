from __future__ import annotations

import signal

import redis
from django.conf import settings
from rq import Queue, SimpleWorker

from apps.core.redis_outage import OutageTolerantWorker
from apps.notifications.hooks import QUEUE
from apps.notifications.tasks import QuietRetries


class NotifyWorker(QuietRetries, OutageTolerantWorker, SimpleWorker):
    """The notify worker (manage.py notify_worker), without its fork."""


def run_notifications() -> None:
    """Drain the notifications queue in this process with RQ's non-forking worker, so it
    sees the test's database transaction. Retries with interval 0 are requeued at once.
    RQ installs its SIGINT/SIGTERM handlers in the process it runs in: put pytest's back."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    connection = redis.Redis.from_url(settings.REDIS_URL)
    try:
        NotifyWorker([Queue(QUEUE, connection=connection)], connection=connection).work(burst=True)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
