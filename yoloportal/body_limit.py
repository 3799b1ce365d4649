"""Request bodies past a per-path limit are refused with 413 before they are read.

Django's ASGI handler reads the whole body into a spooled file before any view runs,
so a size check in a view comes after the disk has filled (issue 9, finding 5). Two
guards, one limit table (:func:`body_limit_for`):

1. :class:`BodyLimitMiddleware`, an ASGI middleware in front of the Django app (every
   ASGI server): a ``Content-Length`` over the limit is answered 413 without receiving a
   single body message; a chunked body (no ``Content-Length``) is counted as it arrives
   and refused once it passes the limit, before Django has the rest.
2. :func:`install_daphne_body_limit`: Daphne (Twisted) receives the *whole* body before
   it calls the ASGI app at all, so the middleware alone would answer only after the
   upload finished. This puts the same check into Daphne's request object: at the
   headers (``Content-Length``) and per received chunk, it writes the 413 and closes the
   connection, so the rest is never read. Installed from ``yoloportal.asgi``.

A proxy in front should have its own limit (nginx ``client_max_body_size``); see
docs/security.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from django.conf import settings

MULTIPART_SLACK = 1024**2  # form fields and part headers around an upload
SPEC_SLACK = 64 * 1024

# (path pattern, the limit in bytes); the first match wins, else REQUEST_MAX_BYTES.
_LIMITS: list[tuple[re.Pattern[str], Callable[[], int]]] = [
    (re.compile(r"^/api/v1/datasets/?$"), lambda: settings.DATASET_UPLOAD_MAX_BYTES + MULTIPART_SLACK),
    (re.compile(r"^/api/v1/weights/?$"), lambda: settings.WEIGHTS_UPLOAD_MAX_BYTES + MULTIPART_SLACK),
    # A spec as JSON/YAML, or the portal's form: the text box and an uploaded file.
    (re.compile(r"^/api/v1/jobs/?$"), lambda: 2 * settings.SPEC_MAX_BYTES + SPEC_SLACK),
    (re.compile(r"^/jobs/new/?$"), lambda: 2 * settings.SPEC_MAX_BYTES + SPEC_SLACK),
]


def body_limit_for(path: str) -> int:
    """The largest request body accepted for ``path`` (no query string)."""
    for pattern, limit in _LIMITS:
        if pattern.match(path):
            return limit()
    return settings.REQUEST_MAX_BYTES


def refusal_body(path: str, limit: int, declared: int | None) -> bytes:
    size = f"is {declared} bytes" if declared is not None else "is larger than that"
    return json.dumps({"detail": f"the request body {size}; the limit for {path} is {limit} bytes",
                       "limit": limit}).encode()


class BodyTooLarge(Exception):
    pass


class BodyLimitMiddleware:
    """ASGI middleware: 413 for bodies over :func:`body_limit_for`, before they are read."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        limit = body_limit_for(path)
        declared = None
        for name, value in scope.get("headers", []):
            if name.lower() == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    return await self.respond(send, 400, json.dumps(
                        {"detail": "Content-Length is not a number"}).encode())
        if declared is not None and declared > limit:
            return await self.respond(send, 413, refusal_body(path, limit, declared))

        received = 0
        started = False

        async def counted_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge
            return message

        async def watched_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted_receive, watched_send)
        except BodyTooLarge:
            if not started:
                await self.respond(send, 413, refusal_body(path, limit, None))

    @staticmethod
    async def respond(send, status: int, body: bytes) -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


def install_daphne_body_limit() -> bool:
    """Make Daphne refuse oversized bodies while receiving them (see the module docstring).

    Replaces ``daphne.http_protocol.WebRequest`` (what Daphne's HTTP factory builds per
    request) with a subclass; returns False when Daphne is not installed. Twisted calls
    ``gotLength`` once the headers are in (``None`` for chunked bodies) and
    ``handleContentChunk`` for every piece of body; both run before Daphne calls the app.
    """
    try:
        from daphne import http_protocol
    except ImportError:
        return False
    if getattr(http_protocol.WebRequest, "body_limited", False):
        return True

    class BodyLimitedWebRequest(http_protocol.WebRequest):
        body_limited = True

        def gotLength(self, length):  # noqa: N802 - Twisted's name
            raw = getattr(self.channel, "_path", b"/") or b"/"
            self._path_for_limit = raw.split(b"?", 1)[0].decode("latin-1")
            self._body_limit = body_limit_for(self._path_for_limit)
            self._body_seen = 0
            self._body_refused = False
            if length is not None and length > self._body_limit:
                self._refuse(length)
                super().gotLength(0)  # nothing of the body will be kept
                return
            super().gotLength(length)

        def handleContentChunk(self, data):  # noqa: N802
            if self._body_refused:
                return
            self._body_seen += len(data)
            if self._body_seen > self._body_limit:
                self._refuse(None)
                return
            super().handleContentChunk(data)

        def process(self):
            if getattr(self, "_body_refused", False):
                return None  # answered already; the app never sees this request
            return super().process()

        def _refuse(self, declared):
            self._body_refused = True
            body = refusal_body(self._path_for_limit, self._body_limit, declared)
            head = (b"HTTP/1.1 413 Request Entity Too Large\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body))
            transport = self.channel.transport
            transport.write(head + body)
            transport.loseConnection()  # stops reading: the rest of the body is never received

    http_protocol.WebRequest = BodyLimitedWebRequest
    return True
