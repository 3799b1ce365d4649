"""The ASGI handler runs a request's synchronous work in one hop on a long-lived thread
(yoloportal/asgi_threads.py): database connections and the Redis client outlive requests."""

from __future__ import annotations

import asyncio
import threading

import pytest
from django.core.cache import cache
from django.db import connection
from django.http import JsonResponse
from django.test import override_settings
from django.urls import path

from yoloportal.asgi_threads import ThreadPoolASGIHandler


def where(request):
    connection.ensure_connection()
    return JsonResponse({"thread": threading.get_ident(), "connection": id(connection.connection),
                         "redis": id(cache._cache), "user": request.user.is_authenticated})


urlpatterns = [path("where/", where)]


async def call(app, path_: str) -> tuple[int, bytes]:
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": path_, "raw_path": path_.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"testserver")], "client": ("127.0.0.1", 1234), "server": ("testserver", 80)}
    sent: list[dict] = []

    messages = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive():
        if messages:
            return messages.pop()
        await asyncio.Event().wait()  # the client stays connected until the response is sent

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, body


@pytest.mark.django_db(transaction=True)
@override_settings(ROOT_URLCONF=__name__, ALLOWED_HOSTS=["testserver"])
def test_requests_reuse_their_threads_database_connection_and_redis_client():
    import json

    app = ThreadPoolASGIHandler(threads=2)

    async def many():
        sequential = [await call(app, "/where/") for _ in range(4)]
        concurrent = await asyncio.gather(*[call(app, "/where/") for _ in range(6)])
        return sequential + list(concurrent)

    results = asyncio.run(many())
    assert all(status == 200 for status, _ in results), results
    seen = [json.loads(body) for _, body in results]
    # The middleware ran (sessions, auth) in the same hop as the view.
    assert all(s["user"] is False for s in seen)
    # Two threads at most; each keeps one connection across requests.
    threads = {s["thread"] for s in seen}
    assert 1 <= len(threads) <= 2
    for thread in threads:
        assert len({s["connection"] for s in seen if s["thread"] == thread}) == 1
    # One Redis client for the process, whichever thread or request context asks.
    assert len({s["redis"] for s in seen}) == 1


def test_the_served_application_is_the_threaded_handler():
    from yoloportal import asgi

    assert isinstance(asgi.django_asgi_app, ThreadPoolASGIHandler)
