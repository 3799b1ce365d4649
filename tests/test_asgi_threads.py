"""The ASGI handler runs a request's synchronous work in one hop on a long-lived thread
(yoloportal/asgi_threads.py): database connections and the Redis client outlive requests."""

from __future__ import annotations

import asyncio
import threading

import pytest
from django.core import signals
from django.core.cache import cache
from django.db import connection
from django.http import FileResponse, JsonResponse, StreamingHttpResponse
from django.test import override_settings
from django.urls import path

from yoloportal.asgi_threads import ThreadPoolASGIHandler


def where(request):
    connection.ensure_connection()
    return JsonResponse({"thread": threading.get_ident(), "connection": id(connection.connection),
                         "redis": id(cache._cache), "user": request.user.is_authenticated})


def stream(request):
    async def parts():  # (Django reads a synchronous iterator whole, in a thread, before sending)
        for n in range(int(request.GET.get("n", "3"))):
            streamed.append(n)
            yield f"part {n};".encode()

    response = StreamingHttpResponse(parts())
    response._resource_closers.append(lambda: closed.append(threading.get_ident()))
    return response


def download(request):
    files.append(open(request.GET["path"], "rb"))  # noqa: SIM115 - the response closes it
    return FileResponse(files[-1], as_attachment=True, filename="w.bin")


files: list = []
streamed: list[int] = []
closed: list[int] = []
urlpatterns = [path("where/", where), path("stream/", stream), path("download/", download)]


async def call(app, path_: str, *, disconnect: bool = False) -> tuple[int, bytes]:
    path_, _, query = path_.partition("?")
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": path_, "raw_path": path_.encode(), "query_string": query.encode(), "root_path": "",
             "headers": [(b"host", b"testserver")], "client": ("127.0.0.1", 1234), "server": ("testserver", 80)}
    sent: list[dict] = []

    messages = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive():
        if messages:
            return messages.pop()
        if disconnect:
            await asyncio.sleep(0.05)
            return {"type": "http.disconnect"}
        await asyncio.Event().wait()  # the client stays connected until the response is sent

    async def send(message):
        sent.append(message)
        if disconnect:
            await asyncio.sleep(0.01)  # a slow client

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


@pytest.mark.django_db(transaction=True)
@override_settings(ROOT_URLCONF=__name__, ALLOWED_HOSTS=["testserver"])
def test_the_request_signals_and_the_view_run_in_one_hop_on_one_thread():
    import json

    seen: dict[str, list[int]] = {"started": [], "finished": []}

    def started(**kwargs):
        seen["started"].append(threading.get_ident())

    def finished(**kwargs):
        seen["finished"].append(threading.get_ident())

    signals.request_started.connect(started)
    signals.request_finished.connect(finished)
    app = ThreadPoolASGIHandler(threads=1)
    hops = []
    original = app.respond

    def respond(*args):
        hops.append(threading.get_ident())
        return original(*args)

    app.respond = respond
    try:
        status, body = asyncio.run(call(app, "/where/"))
    finally:
        signals.request_started.disconnect(started)
        signals.request_finished.disconnect(finished)
    assert status == 200
    view_thread = json.loads(body)["thread"]
    assert hops == [view_thread] and seen == {"started": [view_thread], "finished": [view_thread]}


@pytest.mark.django_db(transaction=True)
@override_settings(ROOT_URLCONF=__name__, ALLOWED_HOSTS=["testserver"])
def test_a_streaming_response_is_sent_whole_then_closed_and_stops_when_the_client_leaves():
    app = ThreadPoolASGIHandler(threads=1)
    streamed.clear(), closed.clear()
    status, body = asyncio.run(call(app, "/stream/?n=3"))
    assert (status, body, len(closed)) == (200, b"part 0;part 1;part 2;", 1)

    streamed.clear(), closed.clear()
    status, body = asyncio.run(call(app, "/stream/?n=100000", disconnect=True))
    assert status == 200 and len(closed) == 1
    assert 0 < len(streamed) < 100000  # stopped when the client went away


@pytest.mark.django_db(transaction=True)
@override_settings(ROOT_URLCONF=__name__, ALLOWED_HOSTS=["testserver"])
def test_a_file_response_is_sent_whole_and_its_file_closed(tmp_path):
    data = bytes(range(256)) * 4096 + b"end"  # 1 MiB and a bit: several chunks
    (tmp_path / "w.bin").write_bytes(data)
    app = ThreadPoolASGIHandler(threads=1)
    files.clear()
    status, body = asyncio.run(call(app, f"/download/?path={tmp_path / 'w.bin'}"))
    assert (status, body) == (200, data)
    assert len(files) == 1 and files[0].closed


def test_the_served_application_is_the_threaded_handler():
    from yoloportal import asgi

    assert isinstance(asgi.django_asgi_app, ThreadPoolASGIHandler)
