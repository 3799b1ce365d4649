"""Rate limits for the endpoints worth guessing at or flooding: submit, uploads and authentication.

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

from django.core.cache import cache
from rest_framework.throttling import SimpleRateThrottle

log = logging.getLogger(__name__)


def _cache_down(exc: Exception) -> bool:
    """True for the errors of an unreachable cache (logged once per call)."""
    from redis.exceptions import RedisError

    if isinstance(exc, (RedisError, ConnectionError, OSError)):
        log.warning("throttle cache unavailable, letting the request through: %s", exc)
        return True
    return False


class SharedCacheThrottle(SimpleRateThrottle):
    """A DRF rate throttle over the shared cache that fails open when the cache is down."""

    def allow_request(self, request, view):
        try:
            return super().allow_request(request, view)
        except Exception as exc:  # noqa: BLE001 - re-raised unless it is the cache being down
            if _cache_down(exc):
                return True
            raise


class SubmitThrottle(SharedCacheThrottle):
    """Job submissions per user: the API's POST /jobs/ and the portal's submit and resubmit."""

    scope = "submit"

    def get_cache_key(self, request, view):
        ident = request.user.pk if request.user and request.user.is_authenticated else self.get_ident(request)
        return self.cache_format % {"scope": self.scope, "ident": ident}


class UploadThrottle(SubmitThrottle):
    """Dataset uploads per user (each may be gigabytes)."""

    scope = "upload"


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
    return allowed
