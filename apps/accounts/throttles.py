"""Rate limits for the endpoints worth guessing at or flooding: submit, uploads, authentication
and notification test messages.

Rates come from ``settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]`` (env-driven). Counts
live in Django's default cache, which is Redis (``CACHES`` at ``REDIS_URL``): every web
process counts against the same numbers. If Redis cannot be reached the limits let the
request through (logged): Redis is delivery, and a throttle outage must not take sign-in
or submitting down with it (docs/security.md).

The portal's pages use the same classes as the API (``allow_submit``), so a browser
cannot submit or create tokens faster than a script can.
"""

from __future__ import annotations

import logging
import secrets

from django.core.cache import cache
from redis.commands.core import Script
from rest_framework.throttling import SimpleRateThrottle

from apps.core.redis_outage import redis_reachable, redis_use_failed

log = logging.getLogger(__name__)


def _cache_down(exc: Exception) -> bool:
    """True for the errors of an unreachable cache. Redis being away is one WARNING per process
    and outage (apps/core/redis_outage.py: it says rate limits are not enforced meanwhile);
    any other cache error is logged on each call."""
    from redis.exceptions import RedisError

    if redis_use_failed(exc):
        return True
    if isinstance(exc, (RedisError, ConnectionError, OSError)):
        log.warning("throttle cache unavailable, letting the request through: %s", exc)
        return True
    return False


# KEYS[1]: the client's request times, a sorted set (score = time). ARGV: now, the period (s),
# the limit, a member name unique to this request. DRF's rule exactly: drop the times a
# period old or older; refuse if ``limit`` remain (a refusal is not recorded), else record
# now. Returns {allowed, times now counted, the oldest time counted}.
_COUNT_LUA = """
local now, period, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - period)
local count = redis.call('ZCARD', KEYS[1])
if count >= limit then
    local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    return {0, count, oldest[2] or ARGV[1]}
end
redis.call('ZADD', KEYS[1], now, ARGV[4])
redis.call('EXPIRE', KEYS[1], period)
return {1, count + 1, ARGV[1]}
"""
_count_script: Script | None = None


class SharedCacheThrottle(SimpleRateThrottle):
    """DRF's rate throttle with its request log kept in Redis, counted by one script call;
    fails open when Redis is down.

    DRF keeps each client's request times as one pickled list in the cache, read and
    rewritten whole by every request: O(requests in the window) of transfer and
    (un)pickling per request, which a raised limit (a load test's ``THROTTLE_SUBMIT``)
    made the costliest part of a submit, and two round trips that race between web
    processes (two requests read the same list; one's write is lost). Here the times are a
    Redis sorted set and one Lua script drops the expired ones, counts and records —
    atomically across processes, in one round trip, O(log n) inside Redis and nothing
    proportional to n on the wire. The rule is DRF's exactly: a sliding window, refusals
    not recorded, ``wait()`` = until the oldest counted request leaves the window. (A
    fixed-window counter would be O(1) but lets twice the limit through around a window's
    edge, and a two-window estimate either does that at small limits — ``upload`` is
    60/hour — or blocks for up to twice the period; the set holds at most ``limit``
    entries per client.)

    ``allow_request``/``wait`` are DRF's interface (the views' 429 with ``Retry-After``,
    ``throttle_wait`` for the portal); rates and ``THROTTLE_RATES`` are read as DRF reads them.
    """

    def allow_request(self, request, view):
        if self.rate is None:
            return True
        key = self.get_cache_key(request, view)
        if key is None:
            return True
        self.now = self.timer()
        try:
            allowed, self.counted, oldest = self._count(key)
        except Exception as exc:  # noqa: BLE001 - re-raised unless it is the cache being down
            if _cache_down(exc):
                return True
            raise
        redis_reachable()
        self.oldest = float(oldest)
        return bool(allowed)

    def _count(self, key: str) -> list:
        global _count_script
        client = cache.redis(key)
        if _count_script is None:
            _count_script = Script(client, _COUNT_LUA)
        member = self.member = f"{self.now!r}:{secrets.token_hex(6)}"
        return _count_script(keys=[cache.make_and_validate_key(key)],
                             args=[repr(self.now), self.duration, self.num_requests, member], client=client)

    def wait(self) -> float | None:
        """Seconds until a request would be let in (after a refusal), as DRF computes it."""
        available = self.num_requests - self.counted + 1
        if available <= 0:
            return None
        return (self.duration - (self.now - self.oldest)) / available


class SubmitThrottle(SharedCacheThrottle):
    """Job submissions per user: the API's POST /jobs/ and the portal's submit and resubmit."""

    scope = "submit"

    def get_cache_key(self, request, view):
        ident = request.user.pk if request.user and request.user.is_authenticated else self.get_ident(request)
        return self.cache_format % {"scope": self.scope, "ident": ident}


class UploadThrottle(SubmitThrottle):
    """Uploads per user, datasets and weights on one counter (each may be gigabytes).

    Only uploads that stored a new version (a 201) count against the rate. The views answer
    the others — a refused upload (a 4xx, or a 503 from a store that is down) and an unchanged
    one (a 200: the newest version already held exactly these files) — through
    :class:`RefundsRefusedUploads`, which takes each back out of the count and counts it instead
    against ``REFUSED_FACTOR`` × the rate, kept apart: a new user iterating on a broken zip, or a
    script that pushes the same folder every run, is not locked out for an hour (trial16 G16), and
    a flood of garbage still is.
    """

    scope = "upload"
    REFUSED_FACTOR = 5

    def allow_request(self, request, view):
        if self.rate is None:
            return True
        key = self.get_cache_key(request, view)
        self.now = self.timer()
        try:
            refused, oldest = _recent(f"{key}:refused", now=self.now, period=self.duration)
        except Exception as exc:  # noqa: BLE001 - re-raised unless it is the cache being down
            if _cache_down(exc):
                return True
            raise
        if refused >= self.num_requests * self.REFUSED_FACTOR:
            limit = f"{self.num_requests * self.REFUSED_FACTOR}/{self.rate.split('/')[1]}"
            request.throttled_limit = (f"the limit on refused uploads is {limit} (an upload answered with an "
                                       f"error, or one the newest version already held, counts there instead "
                                       f"of against the upload limit of {self.rate})",
                                       limit)
            self.num_requests, self.counted, self.oldest = self.num_requests * self.REFUSED_FACTOR, refused, oldest
            return False
        allowed = super().allow_request(request, view)
        if allowed and getattr(self, "member", None):
            request.upload_charge = (key, self.member, self.now, self.duration)
        return allowed


def _recent(key: str, *, now: float, period: int) -> tuple[int, float]:
    """(entries of the sorted set ``key`` less than ``period`` old, the oldest one's time), after
    dropping the expired ones; records nothing."""
    client = cache.redis(key)
    full_key = cache.make_and_validate_key(key)
    with client.pipeline() as pipe:
        pipe.zremrangebyscore(full_key, "-inf", now - period)
        pipe.zcard(full_key)
        pipe.zrange(full_key, 0, 0, withscores=True)
        _, count, oldest = pipe.execute()
    return count, (oldest[0][1] if oldest else now)


def upload_settle(request, response) -> None:
    """After an upload view answered: an upload that stored no new version (any answer but a 201:
    refused, or a 200 "unchanged") leaves the upload count and joins the refused-upload count
    (:class:`UploadThrottle`)."""
    charge = getattr(request, "upload_charge", None)
    if charge is None or response.status_code == 201:
        return
    key, member, now, period = charge
    request.upload_charge = None
    try:
        client = cache.redis(key)
        counted, refused = cache.make_and_validate_key(key), cache.make_and_validate_key(f"{key}:refused")
        with client.pipeline() as pipe:
            pipe.zrem(counted, member)
            pipe.zadd(refused, {member: now})
            pipe.expire(refused, period)
            pipe.execute()
    except Exception as exc:  # noqa: BLE001 - re-raised unless it is the cache being down
        if not _cache_down(exc):
            raise


class RefundsRefusedUploads:
    """Mixin for an APIView throttled by :class:`UploadThrottle`: settles the count once the
    answer is known (DRF calls ``finalize_response`` for every answer, a 429 or 400 included)."""

    def finalize_response(self, request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        upload_settle(request, response)
        return response


class ChannelTestThrottle(SubmitThrottle):
    """Test messages per user (API ``channels/{id}/test/`` and the portal's Test button, one counter):
    each one is a mail or an HTTP request sent now, to an address the caller typed."""

    scope = "channel_test"


class AuthThrottle(SharedCacheThrottle):
    """Token creation (API and portal), per client address (and per user when known)."""

    scope = "auth"

    def get_cache_key(self, request, view):
        ident = self.get_ident(request)
        if request.user and request.user.is_authenticated:
            ident = f"{ident}:{request.user.pk}"
        return self.cache_format % {"scope": self.scope, "ident": ident}


def throttle_wait(throttle: SimpleRateThrottle, request) -> float | None:
    """Count ``request`` against ``throttle`` outside DRF (the portal's pages): None if allowed,
    else the seconds to wait."""
    if throttle.allow_request(request, None):
        return None
    return throttle.wait() or 1.0


def parse_rate(rate: str) -> tuple[int, int]:
    """``"10/min"`` → (10, 60), as DRF reads rates."""
    count, period = rate.split("/")
    return int(count), {"s": 1, "m": 60, "h": 3600, "d": 86400}[period[0]]


def login_attempt_allowed(*, ip: str, username: str, rate: tuple[int, int]) -> bool:
    """Count a login attempt for this address and this username; False once either is over ``rate``.

    Keyed both ways so one address cannot spray many accounts and many addresses
    cannot hammer one account faster than the limit. The portal's and the admin's sign-in
    pages count together.
    """
    limit, period = rate
    allowed = True
    try:
        for key in (f"login:ip:{ip}", f"login:user:{username.lower()[:150]}"):
            cache.add(key, 0, timeout=period)
            try:
                count = cache.incr(key)
            except ValueError:  # expired between add and incr
                cache.set(key, 1, timeout=period)
                count = 1
            allowed = allowed and count <= limit
    except Exception as exc:  # noqa: BLE001
        if _cache_down(exc):
            return True
        raise
    redis_reachable()
    return allowed
