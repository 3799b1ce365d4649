"""The one door from the job services into notifications: cheap, after commit, never raising.

``jobs.services.job_event`` calls :func:`job_event_recorded` for every JobEvent. Kinds
that may notify are handed to the ``notifications`` RQ queue *after the transaction
commits*, as ids only; everything else (who wants it, rendering, sending, retries) runs
in the notification worker, so a slow or failing endpoint never slows the scheduler or a
training worker. This module imports no app, so jobs → notifications adds no cycle.
"""

from __future__ import annotations

import logging

import redis
from django.db import transaction

log = logging.getLogger(__name__)
QUEUE = "notifications"
# JobEvent kind -> what it may become ("running" becomes started_late if the wait was long).
# "cancelled" is news only when someone other than the owner cancelled (tasks.cancelled_by_another).
NOTIFYING_KINDS = {"succeeded", "failed", "timed_out", "preempted", "running", "cancelled"}


def job_event_recorded(*, job_id, kind: str, event_id: int) -> None:
    if kind not in NOTIFYING_KINDS:
        return
    transaction.on_commit(lambda: enqueue("apps.notifications.tasks.fan_out", str(job_id), kind, event_id))


def enqueue(function: str, *args, **options) -> None:
    from rq import Queue

    from apps.core.redis_client import redis_client
    from apps.core.redis_outage import redis_reachable, redis_use_failed

    try:
        Queue(QUEUE, connection=redis_client()).enqueue(function, *args, result_ttl=0, failure_ttl=7 * 86400,
                                                        **options)
    except redis.RedisError as exc:
        # Redis away: one line per process and outage (apps/core/redis_outage.py); the scheduler's
        # catch-up (tasks.catch_up) queues what was lost once it is back.
        if redis_use_failed(exc):
            log.debug("notification for %s not queued (Redis: %s)", args, exc)
        else:
            log.warning("notification for %s not queued (Redis: %s)", args, exc)
    else:
        redis_reachable()
