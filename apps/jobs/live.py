"""Publishing to the job's WebSocket group. Best effort: the database is the record.

Channel-layer sends are at-most-once and may be dropped (capacity, Redis down); every
message carries the job's ``seq`` so a page can notice a gap and refetch over REST.
"""

from __future__ import annotations

import logging
from typing import Any, Literal, TypedDict

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

log = logging.getLogger(__name__)


class LiveMessage(TypedDict, total=False):
    type: Literal["metrics", "status", "log", "progress"]
    seq: int
    job: str
    data: dict[str, Any]


def group_name(job_id) -> str:
    return f"job.{job_id}"


def publish(job_id, message: LiveMessage) -> bool:
    """Send to everyone watching the job; never raises (Redis may be down)."""
    layer = get_channel_layer()
    if layer is None:
        return False
    try:
        async_to_sync(layer.group_send)(group_name(job_id), {"type": "job.message", "message": message})
        return True
    except Exception as exc:  # noqa: BLE001 - delivery is best effort by design
        log.debug("live publish for job %s dropped: %s", job_id, exc)
        return False
