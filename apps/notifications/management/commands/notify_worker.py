"""manage.py notify_worker: the RQ worker for the ``notifications`` queue (with RQ's scheduler,
which runs the delayed retries)."""

from __future__ import annotations

import redis
from django.conf import settings
from django.core.management.base import BaseCommand
from rq import Queue, Worker

from apps.core.redis_outage import OutageTolerantWorker, redis_outage_consequence
from apps.notifications.hooks import QUEUE
from apps.notifications.tasks import QuietRetries
from yoloportal.logs import bind


class NotifyWorker(QuietRetries, OutageTolerantWorker, Worker):
    """RQ's worker, but a delivery try that will be retried is logged once, as a warning, and a
    Redis outage is one line (its scheduler waits it out)."""


class Command(BaseCommand):
    help = "Send notifications (email, webhooks) queued by job events; retries with backoff."

    def add_arguments(self, parser):
        parser.add_argument("--burst", action="store_true", help="exit when the queue is empty")

    def handle(self, *args, burst: bool = False, **options):
        bind(component="notify")
        redis_outage_consequence("notifications are sent once it is back")
        connection = redis.Redis.from_url(settings.REDIS_URL)
        worker = NotifyWorker([Queue(QUEUE, connection=connection)], connection=connection)
        worker.work(with_scheduler=True, burst=burst, logging_level=settings.LOGGING["root"]["level"])
