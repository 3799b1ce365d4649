"""X-Request-ID: taken from the proxy when it is a sane token, else minted; logged and echoed."""

from __future__ import annotations

import re
import uuid

from yoloportal.logs import bind, reset

SAFE_ID = re.compile(r"^[A-Za-z0-9._-]{8,64}$")


class RequestIdMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        given = request.headers.get("X-Request-ID", "")
        request.request_id = given if SAFE_ID.match(given) else uuid.uuid4().hex
        token = bind(request_id=request.request_id)
        try:
            response = self.get_response(request)
        finally:
            reset(token)
        response["X-Request-ID"] = request.request_id
        return response
