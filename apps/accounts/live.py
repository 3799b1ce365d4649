"""Telling a person's open WebSockets that what they may see changed (a membership went away).

Best effort, like every channel-layer send: sockets also re-check on their own every
``WS_ACCESS_RECHECK_S`` seconds (apps.portal.consumers), so a lost message or a change made
behind the services' back (a cascade, a deactivated account) still closes them in time.
"""

from __future__ import annotations

from apps.core.channel_send import group_send


def access_group(user_id) -> str:
    return f"access.{user_id}"


def access_changed(user_id) -> bool:
    """Ask ``user_id``'s open sockets to re-check what they show; never raises, never waits long
    (apps.core.channel_send: a hung Redis held the request removing a member 30 s)."""
    return group_send(access_group(user_id), {"type": "access.changed"})
