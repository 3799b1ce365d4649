"""Telling a person's open WebSockets that what they may see changed (a membership went away).

Best effort, like every channel-layer send: sockets also re-check on their own every
``WS_ACCESS_RECHECK_S`` seconds (apps.portal.consumers), so a lost message or a change made
behind the services' back (a cascade, a deactivated account) still closes them in time.
"""

from __future__ import annotations

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

log = logging.getLogger(__name__)


def access_group(user_id) -> str:
    return f"access.{user_id}"


def access_changed(user_id) -> bool:
    """Ask ``user_id``'s open sockets to re-check what they show; never raises."""
    layer = get_channel_layer()
    if layer is None:
        return False
    try:
        async_to_sync(layer.group_send)(access_group(user_id), {"type": "access.changed"})
        return True
    except Exception as exc:  # noqa: BLE001 - delivery is best effort; the periodic re-check remains
        log.debug("access change for user %s not delivered: %s", user_id, exc)
        return False
