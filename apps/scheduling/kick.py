"""Waking the scheduler: a Redis list it blocks on. Best effort; it also wakes on a timer."""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time

import redis

from apps.core.redis_client import redis_client

log = logging.getLogger(__name__)
KICK_KEY = "yoloportal:scheduler:kick"
# The kicker thread sends at most one kick per this many seconds (a kick asked for meanwhile
# waits for the next one): at 100s of submits/s a process sends ~1/KICK_INTERVAL_S kicks, not
# one per submit. Small next to a scheduler pass (and to SCHEDULER_TICK_S, its timer).
KICK_INTERVAL_S = 0.02


def kick_scheduler() -> None:
    try:
        pipe = redis_client().pipeline(transaction=False)  # one round trip; no MULTI/EXEC needed
        pipe.lpush(KICK_KEY, 1)
        pipe.ltrim(KICK_KEY, 0, 9)
        pipe.execute()
    except redis.RedisError as exc:
        log.warning("could not kick the scheduler (it will still run on its timer): %s", exc)


class _Kicker:
    """Kicks sent by one thread of the process, off the caller's path, coalesced.

    A submit's kick was a Redis round trip on the request's thread after its commit (about a
    sixth of a submit's time in the web process under 16 clients, docs/performance.md). Here
    :meth:`soon` only sets an event; this process's kicker thread sends a kick for it. Any
    number of requests while one kick is in flight are answered by one more kick after it,
    never by none: the event is cleared *before* each send, so a request that comes during a
    send sets it again and is kicked for by the next one. The scheduler reads the queue from
    the database when woken, so one kick after a commit covers every job committed before it.
    After each send the thread waits ``KICK_INTERVAL_S`` before the next: one kick per 20 ms
    at most per process, however many submits.

    Per process (a forked child starts its own thread); a kick still pending at interpreter
    exit is sent then (``atexit``).
    """

    def __init__(self, interval_s: float = KICK_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.pending = threading.Event()
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.pid = 0
        self.sent = 0  # kicks sent (tests: coalescing)

    def soon(self) -> None:
        if self.pid != os.getpid() or self.thread is None or not self.thread.is_alive():
            self._start()
        self.pending.set()

    def _start(self) -> None:
        with self.lock:
            if self.pid == os.getpid() and self.thread is not None and self.thread.is_alive():
                return
            if self.pid != os.getpid():  # a fork's copy of the parent's state: not ours
                self.pending = threading.Event()
            self.pid = os.getpid()
            self.thread = threading.Thread(target=self._run, name="scheduler-kicker", daemon=True)
            self.thread.start()

    def _run(self) -> None:
        while True:
            self.pending.wait()
            self.pending.clear()  # before the send: a request during it is kicked for again
            kick_scheduler()
            self.sent += 1
            time.sleep(self.interval_s)

    def flush(self) -> None:
        """Send a kick still pending now (interpreter exit)."""
        if self.pid == os.getpid() and self.pending.is_set():
            self.pending.clear()
            kick_scheduler()
            self.sent += 1


_kicker = _Kicker()
atexit.register(_kicker.flush)


def kick_scheduler_soon() -> None:
    """:func:`kick_scheduler` from this process's kicker thread, coalesced with other kicks
    asked for meanwhile; returns at once (the submit path's after-commit hook)."""
    _kicker.soon()


def wait_for_kick(timeout_s: float) -> bool:
    """Block until kicked or ``timeout_s``; drain extra kicks. True if kicked."""
    client = redis_client()
    got = client.blpop([KICK_KEY], timeout=max(timeout_s, 0.01))
    if got:
        client.delete(KICK_KEY)
    return bool(got)
