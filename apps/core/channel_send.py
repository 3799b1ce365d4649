"""One bounded channel-layer send, for every process that tells open pages something.

The Redis channel layer reads with a 30 s socket timeout (its consumers block in BZPOPMIN:
settings.CHANNEL_LAYERS), so a Redis that hangs instead of refusing held each sender that
long per message: the scheduler's loop, a worker's monitor, a web request removing a member.
Every send is best effort (pages reconnect and refetch; sockets re-check their access), so
it gives up after :data:`SEND_TIMEOUT_S`.
"""

from __future__ import annotations

import asyncio
import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

log = logging.getLogger(__name__)

SEND_TIMEOUT_S = 2.0


def group_send(group: str, message: dict) -> bool:
    """Send ``message`` to ``group``; False (never an exception) when it could not be sent in time."""
    layer = get_channel_layer()
    if layer is None:
        return False

    async def send() -> None:
        await asyncio.wait_for(layer.group_send(group, message), SEND_TIMEOUT_S)

    try:
        async_to_sync(send)()
        return True
    except Exception as exc:  # noqa: BLE001 - delivery is best effort by design
        log.debug("channel-layer send to %s dropped: %r", group, exc)
        return False
