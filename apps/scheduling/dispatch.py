"""Handing a started job to its node's RQ queue. RQ gets ids, never model instances."""

from __future__ import annotations

import logging

import redis
from rq import Queue
from rq.exceptions import NoSuchJobError
from rq.job import Job as RQJob
from rq.job import JobStatus

from apps.core.redis_client import redis_client
from apps.jobs.models import Job

log = logging.getLogger(__name__)
RUN_ATTEMPT = "worker.tasks.run_attempt"
# RQ's own timeout is a backstop only: the worker enforces the job's timeout itself and
# needs time afterwards to stop the process tree and record the result.
RQ_TIMEOUT_SLACK_S = 600


def queue_name(node_name: str) -> str:
    return f"node.{node_name}"


def node_queue(node_name: str, connection: redis.Redis | None = None) -> Queue:
    return Queue(queue_name(node_name), connection=connection or redis_client())


def dispatch(job: Job) -> None:
    """Enqueue the job's current attempt on its node's queue (raises RedisError if Redis is down)."""
    node_queue(job.node.name).enqueue(
        RUN_ATTEMPT,
        str(job.pk),
        str(job.attempt_id),
        job_id=job.rq_job_id,
        job_timeout=job.timeout_s + RQ_TIMEOUT_SLACK_S,
        result_ttl=3600,
        failure_ttl=7 * 24 * 3600,
        description=f"{job.task_name} attempt {job.attempt}",
    )


def is_delivered(job: Job) -> bool:
    """Is the current attempt still waiting in, or taken from, its RQ queue?"""
    try:
        rq_job = RQJob.fetch(job.rq_job_id, connection=redis_client())
    except NoSuchJobError:
        return False
    return rq_job.get_status(refresh=False) in {JobStatus.QUEUED, JobStatus.STARTED, JobStatus.DEFERRED,
                                                 JobStatus.SCHEDULED}
