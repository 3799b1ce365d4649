"""Handing a started job to its node's RQ queue. RQ gets ids, never model instances."""

from __future__ import annotations

import logging
from datetime import datetime

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
    """Enqueue the job's current attempt on its node's queue (raises RedisError if Redis is down).

    A Slurm node has no queue: its ``slurm_agent`` submits what the database says is placed
    there (``worker/executors/slurm.py``; iso, issue 12).
    """
    if job.node.executor == "slurm":
        return
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


def undelivered(job: Job, *, taken_before: datetime) -> str:
    """Why the current attempt will not be started from its RQ queue; "" while it will be.

    It will while it waits in its queue, and while a work-horse that took it after
    ``taken_before`` (RQ ``started``) is starting it: a live horse moves the attempt to
    ``running`` first thing (worker.tasks.run_attempt). Taken earlier and still ``starting``,
    its horse died first: its whole worker was killed, and when that worker comes back within
    the node's grace (the node is never lost) nothing else would notice, since RQ cleans up a
    dead worker's jobs only at a live worker's maintenance, every 10 minutes. ``started_at`` is
    the node's clock compared with the scheduler's, as node heartbeats are. A Slurm node's
    attempts are never undelivered: the slurm_agent reads them from the database, not RQ.
    """
    if job.node is not None and job.node.executor == "slurm":
        return ""
    connection = redis_client()
    try:
        rq_job = RQJob.fetch(job.rq_job_id, connection=connection)
    except NoSuchJobError:
        return "Redis did not hold it"
    status = rq_job.get_status(refresh=False)
    if status == JobStatus.STARTED:
        taken = rq_job.started_at
        if taken is not None and taken > taken_before:
            return ""
        return f"a worker took it{f' at {taken:%H:%M:%S}' if taken else ''} and died before starting it"
    if status == JobStatus.QUEUED:
        if node_queue(job.node.name, connection).get_job_position(rq_job.id) is not None:
            return ""
        # Taken from the queue but never marked started: its worker died between the two.
        return "a worker took it from the queue and died before starting it"
    if status in {JobStatus.DEFERRED, JobStatus.SCHEDULED}:
        return ""
    return f"RQ has it as {status}"
