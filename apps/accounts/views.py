"""The sign-in pages, throttled (the rest of the browser pages live in apps.portal)."""

from __future__ import annotations

from functools import wraps

from django.conf import settings
from django.contrib.auth.views import LoginView
from django.http import HttpResponse

from apps.core.api import wait_text

from .throttles import login_attempt_allowed, parse_rate


def login_throttled(view):
    """Wrap a sign-in view: POSTs count per address and per username; 429 beyond the ``login`` rate.

    Used for the portal's ``/accounts/login/`` and the admin's ``/admin/login/``, which
    share the counters (a guesser gains nothing by switching pages).
    """

    @wraps(view)
    def throttled(request, *args, **kwargs):
        rate = settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"].get("login")
        if request.method == "POST" and rate:
            ip = request.META.get("REMOTE_ADDR", "")
            username = str(request.POST.get("username", ""))
            limit, period = parse_rate(rate)
            if not login_attempt_allowed(ip=ip, username=username, rate=(limit, period)):
                # A counter's window ends at most one period after its first attempt. "wait a minute"
                # was said whatever the rate (10/hour: an hour), with no Retry-After (trial 32).
                refused = HttpResponse(
                    f"Too many sign-in attempts: the login limit is {rate}. "
                    f"Try again in {wait_text(period)} at the latest.",
                    status=429, content_type="text/plain; charset=utf-8",
                )
                refused["Retry-After"] = str(period)
                return refused
        return view(request, *args, **kwargs)

    return throttled


class ThrottledLoginView(LoginView):
    """Django's LoginView with the sign-in throttle on POSTs."""

    @classmethod
    def as_view(cls, **initkwargs):
        return login_throttled(super().as_view(**initkwargs))
