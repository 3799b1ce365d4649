"""Which scheduler acts: a lease in Redis, renewed atomically, and a fencing token in the database.

Several ``manage.py scheduler`` processes may run (one per machine, for failover); one leads.

1. A scheduler takes the lease with ``SET key value NX PX ttl``; the value is unique to this
   tenure (``host:pid#nonce``).
2. Having taken it, it increments the fencing token in the database (``LeaderFence``, one
   row) and keeps the new value: every tenure has a larger token than the one before.
3. It renews with a Lua compare-and-renew (``PEXPIRE`` only while the value is still its
   own), never GET-then-EXPIRE: a lease that expired and was taken by another scheduler is
   never extended by the old holder. A clean stop deletes the lease the same way.
4. Every claim transaction runs inside :func:`fenced`: it locks the fence row and goes on only
   while the token is still its own. A leader that was paused past its lease (GC, swap, a
   stopped VM) and wakes up mid-pass cannot allocate once a newer leader has taken over;
   and the GPU slots' unique constraint (apps.jobs.models.GpuSlot) refuses a double
   allocation even then.

Why a Redis lease plus a database fence, and not a PostgreSQL advisory lock: the same code
holds on SQLite and PostgreSQL, Redis already wakes the scheduler, and the fence makes the
lease's weak spots (expiry during a long pause, Redis restarted without its data) harmless:
Redis only decides who *tries*; the database decides whose claims count.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import redis
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from apps.core.redis_client import redis_client
from apps.core.redis_outage import redis_was_down_within

from .models import LeaderFence

log = logging.getLogger(__name__)
LEASE_KEY = "yoloportal:scheduler:leader"

# KEYS[1] = lease key; ARGV[1] = our value; ARGV[2] = ttl in ms.
_RENEW = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0"
_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


class LeadershipLost(Exception):
    """A newer leader holds the fencing token: this scheduler must not act."""


class LeaderLease:
    def __init__(self, holder: str, ttl_s: float, client: redis.Redis | None = None) -> None:
        self.holder = holder
        self.ttl_ms = int(ttl_s * 1000)
        self.client = client
        self.value: str | None = None
        self.token: int | None = None
        self.standing_by_for: str | None = None  # the leader this standby last said it waits on
        self.renewed_at = 0.0  # monotonic: when our last successful renewal (or take) was sent

    def _redis(self) -> redis.Redis:
        return self.client or redis_client()

    def hold(self) -> bool:
        """Renew our lease, or take a free one (with a new fencing token). True while we lead."""
        sent = time.monotonic()
        if self.value is not None:
            if self._redis().eval(_RENEW, 1, LEASE_KEY, self.value, self.ttl_ms):
                self.renewed_at = sent
                return True
            unrenewed_s = sent - self.renewed_at
            if unrenewed_s >= self.ttl_ms / 1000 and redis_was_down_within(unrenewed_s):
                # It ran out while Redis was away: the process's outage WARNING said the lease
                # would lapse; the fence kept it safe. The fact, not a second alarm.
                log.info("scheduler %s's leader lease (token %s) lapsed: not renewed for %.1f s (it lasts %g s)",
                         self.holder, self.token, unrenewed_s, self.ttl_ms / 1000)
            elif unrenewed_s >= self.ttl_ms / 1000:
                # Redis was there: this process stalled (a pass, the database, the machine) past
                # its lease, so another scheduler may have led meanwhile. Worth an operator's look.
                log.warning("scheduler %s's leader lease (token %s) lapsed: this process did not renew it for "
                            "%.1f s (it lasts %g s) though Redis was reachable; it stalled", self.holder,
                            self.token, unrenewed_s, self.ttl_ms / 1000)
            else:
                log.warning("scheduler %s lost the leader lease (token %s)", self.holder, self.token)
            self.value = self.token = None
        value = f"{self.holder}#{uuid.uuid4().hex[:12]}"
        if not self._redis().set(LEASE_KEY, value, nx=True, px=self.ttl_ms):
            # Said once per leader: a standby's log otherwise read like a hung scheduler's (trial M10).
            leader = self.current_holder().partition("#")[0]
            if leader and leader != self.standing_by_for:
                log.info("another scheduler (%s) holds the leader lease; standing by", leader)
                self.standing_by_for = leader
            return False
        self.value, self.renewed_at = value, sent
        self.token = fence_advance(holder=self.holder)
        took_over = f", taking over from {self.standing_by_for}" if self.standing_by_for else ""
        log.info("scheduler %s leads with fencing token %d%s", self.holder, self.token, took_over)
        self.standing_by_for = None
        return True

    def release(self) -> None:
        """Give the lease up (a clean stop) so a standby takes over at once."""
        if self.value is not None:
            try:
                self._redis().eval(_RELEASE, 1, LEASE_KEY, self.value)
            except redis.RedisError:
                pass  # it expires by itself
        self.value = self.token = None

    def current_holder(self) -> str:
        raw = self._redis().get(LEASE_KEY)
        return raw.decode() if raw else ""


def fence_advance(*, holder: str) -> int:
    """The next fencing token, recorded as the newest leader's."""
    with transaction.atomic():
        LeaderFence.objects.get_or_create(pk=1)
        LeaderFence.objects.filter(pk=1).update(token=F("token") + 1, holder=holder[:200],
                                                acquired_at=timezone.now())
        return LeaderFence.objects.values_list("token", flat=True).get(pk=1)


@contextmanager
def fenced(token: int | None) -> Iterator[None]:
    """A transaction that goes on only while ``token`` is the newest leader's (else LeadershipLost).

    The fence row stays locked until the transaction ends (FOR UPDATE on PostgreSQL; SQLite's
    IMMEDIATE transactions lock the whole database), so a newer leader's token cannot land
    in the middle of our claims. ``token=None`` is for tests and tools that call the loop's
    steps directly, without a lease.
    """
    with transaction.atomic():
        if token is not None:
            current = (LeaderFence.objects.select_for_update().filter(pk=1)
                       .values_list("token", flat=True).first())
            if current != token:
                raise LeadershipLost(f"fencing token {token} is stale: token {current} leads now")
        yield
