"""Publishing to the job's WebSocket group. Best effort: the database is the record.

Channel-layer sends are at-most-once and may be dropped (capacity, Redis down); every
message carries the job's ``seq`` so a page can notice a gap and refetch over REST.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Literal, TypedDict

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

log = logging.getLogger(__name__)


class LiveMessage(TypedDict, total=False):
    type: Literal["metrics", "status", "log", "progress"]
    seq: int
    job: str
    data: dict[str, Any]


def group_name(job_id) -> str:
    return f"job.{job_id}"


# The longest one publish may wait on Redis. The channel layer reads with a 30 s socket timeout
# (its consumers block in BZPOPMIN: settings.CHANNEL_LAYERS), and a Redis that hangs instead of
# refusing held every publisher (the scheduler's loop, a worker's monitor) that long per message.
PUBLISH_TIMEOUT_S = 2.0


def publish(job_id, message: LiveMessage) -> bool:
    """Send to everyone watching the job; never raises (Redis may be down), never waits long."""
    layer = get_channel_layer()
    if layer is None:
        return False

    async def send() -> None:
        await asyncio.wait_for(layer.group_send(group_name(job_id), {"type": "job.message", "message": message}),
                               PUBLISH_TIMEOUT_S)

    try:
        async_to_sync(send)()
        return True
    except Exception as exc:  # noqa: BLE001 - delivery is best effort by design
        log.debug("live publish for job %s dropped: %r", job_id, exc)
        return False


def publish_on_commit(job_id, message: LiveMessage) -> None:
    """:func:`publish` once the caller's transaction commits (at once outside one).

    A send waits on Redis (up to the channel layer's socket timeout when Redis hangs instead
    of refusing): inside a transaction that wait held SQLite's write lock, and every other
    writer with it. Callbacks run in the order they were registered, so a job's messages keep
    their seq order; a rolled-back event is never announced.
    """
    transaction.on_commit(lambda: publish(job_id, message))
