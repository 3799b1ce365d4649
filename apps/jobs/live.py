"""Publishing to the job's WebSocket group. Best effort: the database is the record.

Channel-layer sends are at-most-once and may be dropped (capacity, Redis down); every
message carries the job's ``seq`` so a page can notice a gap and refetch over REST.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

from django.db import transaction

from apps.core.channel_send import group_send


class LiveMessage(TypedDict, total=False):
    type: Literal["metrics", "status", "log", "progress"]
    seq: int
    job: str
    data: dict[str, Any]


def group_name(job_id) -> str:
    return f"job.{job_id}"


def publish(job_id, message: LiveMessage) -> bool:
    """Send to everyone watching the job; never raises (Redis may be down), never waits long
    (apps.core.channel_send)."""
    return group_send(group_name(job_id), {"type": "job.message", "message": message})


def publish_on_commit(job_id, message: LiveMessage) -> None:
    """:func:`publish` once the caller's transaction commits (at once outside one).

    A send waits on Redis (up to the channel layer's socket timeout when Redis hangs instead
    of refusing): inside a transaction that wait held SQLite's write lock, and every other
    writer with it. Callbacks run in the order they were registered, so a job's messages keep
    their seq order; a rolled-back event is never announced.
    """
    transaction.on_commit(lambda: publish(job_id, message))
