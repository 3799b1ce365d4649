"""Rate limits for the endpoints worth guessing at or flooding: submit and authentication.

Rates come from ``settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]`` (env-driven). Counts
live in Django's cache (per process by default), so behind several web processes or a
proxy the proxy should rate-limit too; see docs/security.md.
"""

from __future__ import annotations

from django.core.cache import cache
from rest_framework.throttling import SimpleRateThrottle


class SubmitThrottle(SimpleRateThrottle):
    """Job submissions per user."""

    scope = "submit"

    def get_cache_key(self, request, view):
        ident = request.user.pk if request.user and request.user.is_authenticated else self.get_ident(request)
        return self.cache_format % {"scope": self.scope, "ident": ident}


class AuthThrottle(SimpleRateThrottle):
    """Token creation and login attempts, per client address (and per user when known)."""

    scope = "auth"

    def get_cache_key(self, request, view):
        ident = self.get_ident(request)
        if request.user and request.user.is_authenticated:
            ident = f"{ident}:{request.user.pk}"
        return self.cache_format % {"scope": self.scope, "ident": ident}


def parse_rate(rate: str) -> tuple[int, int]:
    """``"10/min"`` → (10, 60), as DRF reads rates."""
    count, period = rate.split("/")
    return int(count), {"s": 1, "m": 60, "h": 3600, "d": 86400}[period[0]]


def login_attempt_allowed(*, ip: str, username: str, rate: tuple[int, int]) -> bool:
    """Count a login attempt for this address and this username; False once either is over ``rate``.

    Keyed both ways so one address cannot spray many accounts and many addresses
    cannot hammer one account faster than the limit.
    """
    limit, period = rate
    allowed = True
    for key in (f"login:ip:{ip}", f"login:user:{username.lower()[:150]}"):
        cache.add(key, 0, timeout=period)
        try:
            count = cache.incr(key)
        except ValueError:  # expired between add and incr
            cache.set(key, 1, timeout=period)
            count = 1
        allowed = allowed and count <= limit
    return allowed
