"""The login page, throttled (the rest of the browser pages live in apps.portal)."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.views import LoginView
from django.http import HttpResponse

from .throttles import login_attempt_allowed, parse_rate


class ThrottledLoginView(LoginView):
    """Django's LoginView with a per-address and per-username limit on POSTs (429 beyond it)."""

    def post(self, request, *args, **kwargs):
        rate = settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"].get("login")
        if rate:
            ip = request.META.get("REMOTE_ADDR", "")
            username = str(request.POST.get("username", ""))
            if not login_attempt_allowed(ip=ip, username=username, rate=parse_rate(rate)):
                return HttpResponse(
                    "Too many login attempts: wait a minute and try again.",
                    status=429, content_type="text/plain; charset=utf-8",
                )
        return super().post(request, *args, **kwargs)
