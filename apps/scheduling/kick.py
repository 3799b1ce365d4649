"""Waking the scheduler: a Redis list it blocks on. Best effort; it also wakes on a timer."""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time

import redis

from apps.core.redis_client import redis_client
from apps.core.redis_outage import redis_reachable, redis_use_failed

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
        # Redis away: one line per process and outage (apps/core/redis_outage.py), not one per kick.
        if not redis_use_failed(exc):
            log.warning("could not kick the scheduler (it will still run on its timer): %s", exc)
    else:
        redis_reachable()


class _Kicker:
    """Kicks sent by one thread of the process, off the caller's path, coalesced.

    A submit's kick was a Redis round trip on the request's thread after its commit (about a
    sixth of a submit's time in the web process under 16 clients, docs/performance.md). Here
    :meth:`soon` only marks a kick as wanted; this process's kicker thread sends it. After each
    send the thread sleeps ``KICK_INTERVAL_S`` and then sends again if a kick was wanted
    meanwhile: at most one kick per interval per process however many submits, and the last
    submit is always kicked for (``wanted`` is cleared *before* each send, so a request during
    a send or the sleep is answered by the next one, never by none). The scheduler reads the
    queue from the database when woken, so one kick after a commit covers every job committed
    before it.

    Under load :meth:`soon` sets one attribute and wakes nobody: only a thread that found
    nothing wanted after its sleep waits on the event (``idle``), and only then does
    :meth:`soon` set it (waking a thread costs the waker its CPU slice on a busy machine —
    measured as ~3% of the web process's GIL time when every submit set an event). The
    order (``soon``: wanted, then idle; the thread: idle, then wanted) makes a lost wake-up
    impossible (the GIL orders them).

    Per process (a forked child starts its own thread); a kick still wanted at interpreter
    exit is sent then (``atexit``).
    """

    def __init__(self, interval_s: float = KICK_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.wake = threading.Event()
        self.wanted = False
        self.idle = False
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.pid = 0
        self.sent = 0  # kicks sent (tests: coalescing)

    def soon(self) -> None:
        if self.pid != os.getpid() or self.thread is None or not self.thread.is_alive():
            self._start()
        self.wanted = True
        if self.idle:
            self.wake.set()

    def _start(self) -> None:
        with self.lock:
            if self.pid == os.getpid() and self.thread is not None and self.thread.is_alive():
                return
            if self.pid != os.getpid():  # a fork's copy of the parent's state: not ours
                self.wake, self.idle = threading.Event(), False
            self.pid = os.getpid()
            self.thread = threading.Thread(target=self._run, name="scheduler-kicker", daemon=True)
            self.thread.start()

    def _run(self) -> None:
        while True:
            self.wake.clear()
            self.idle = True
            if not self.wanted:
                self.wake.wait()
            self.idle = False
            self.wanted = False  # before the send: a request during it is kicked for again
            kick_scheduler()
            self.sent += 1
            time.sleep(self.interval_s)

    def flush(self) -> None:
        """Send a kick still wanted now (interpreter exit)."""
        if self.pid == os.getpid() and self.wanted:
            self.wanted = False
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
