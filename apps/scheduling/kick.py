"""Waking the scheduler: a Redis list it blocks on. Best effort; it also wakes on a timer."""

from __future__ import annotations

import logging

import redis

from apps.core.redis_client import redis_client

log = logging.getLogger(__name__)
KICK_KEY = "yoloportal:scheduler:kick"


def kick_scheduler() -> None:
    try:
        pipe = redis_client().pipeline(transaction=False)  # one round trip; no MULTI/EXEC needed
        pipe.lpush(KICK_KEY, 1)
        pipe.ltrim(KICK_KEY, 0, 9)
        pipe.execute()
    except redis.RedisError as exc:
        log.warning("could not kick the scheduler (it will still run on its timer): %s", exc)


def wait_for_kick(timeout_s: float) -> bool:
    """Block until kicked or ``timeout_s``; drain extra kicks. True if kicked."""
    client = redis_client()
    got = client.blpop([KICK_KEY], timeout=max(timeout_s, 0.01))
    if got:
        client.delete(KICK_KEY)
    return bool(got)
