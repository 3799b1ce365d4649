"""The ASGI handler runs a request's synchronous work in one hop on a long-lived thread
(yoloportal/asgi_threads.py): database connections and the Redis client outlive requests."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import threading
import tracemalloc

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
    async def parts():  # an asynchronous iterator (a synchronous one: the download tests below)
        for n in range(int(request.GET.get("n", "3"))):
            streamed.append(n)
            yield f"part {n};".encode()

    response = StreamingHttpResponse(parts())
    response._resource_closers.append(lambda: closed.append(threading.get_ident()))
    return response


class CountedFile(io.FileIO):
    """A file that remembers how many of its bytes were read and the most held by one read."""

    def read(self, size=-1):
        block = super().read(size)
        self.bytes_read = getattr(self, "bytes_read", 0) + len(block)
        return block


def download(request):
    files.append(CountedFile(request.GET["path"], "rb"))  # the response closes it
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


def big_file(path, mib: int):
    """``mib`` MiB that differ block by block (a wrong or missing block changes the hash)."""
    digest = hashlib.sha256()
    with open(path, "wb") as out:
        seed = os.urandom(1 << 20)
        for n in range(mib):
            block = n.to_bytes(8, "big") + seed[8:]
            digest.update(block)
            out.write(block)
    return digest.hexdigest()


async def download_hashed(app, path_: str, *, leave_after: int = 0, threads: list | None = None):
    """GET ``path_`` from ``app`` like a client that hashes the body as it arrives (keeps none of it)
    and, with ``leave_after``, disconnects once it has that many bytes."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": "/download/", "raw_path": b"/download/", "query_string": f"path={path_}".encode(),
             "root_path": "", "headers": [(b"host", b"testserver")], "client": ("127.0.0.1", 1234),
             "server": ("testserver", 80)}
    digest, got, gone = hashlib.sha256(), {"status": 0, "bytes": 0}, asyncio.Event()
    requested = False

    async def receive():
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.start":
            got["status"] = message["status"]
            return
        digest.update(message.get("body", b""))
        got["bytes"] += len(message.get("body", b""))
        if leave_after and got["bytes"] >= leave_after:
            if threads is not None:
                threads.append(threading.active_count())
            gone.set()
            await asyncio.sleep(0.05)  # the server notices while this send is still under way
        await asyncio.sleep(0)  # a client that reads as fast as it can, still one message at a time

    await app(scope, receive, send)
    return got["status"], got["bytes"], digest.hexdigest()


@pytest.mark.django_db(transaction=True)
@override_settings(ROOT_URLCONF=__name__, ALLOWED_HOSTS=["testserver"])
def test_a_large_file_is_sent_in_blocks_without_ever_being_held_in_memory(tmp_path):
    """64 MiB served through the handler: the bytes arrive unchanged while the memory the
    Python heap grew by at its peak stays a few blocks (Django's own handler: the whole file)."""
    size = 64 << 20
    expected = big_file(tmp_path / "w.bin", 64)
    app = ThreadPoolASGIHandler(threads=1)
    asyncio.run(download_hashed(app, tmp_path / "w.bin"))  # warm: imports, the thread, the database
    files.clear()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        status, sent, digest = asyncio.run(download_hashed(app, tmp_path / "w.bin"))
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert (status, sent, digest) == (200, size, expected)
    assert peak < 4 << 20, f"the heap grew by {peak / 2**20:.1f} MiB serving a {size >> 20} MiB file"
    assert files[-1].closed


@pytest.mark.django_db(transaction=True)
@override_settings(ROOT_URLCONF=__name__, ALLOWED_HOSTS=["testserver"])
def test_a_client_leaving_mid_download_stops_the_reading_and_closes_the_file_on_no_new_thread(tmp_path):
    size = 64 << 20
    big_file(tmp_path / "w.bin", 64)
    app = ThreadPoolASGIHandler(threads=1)
    asyncio.run(download_hashed(app, tmp_path / "w.bin", leave_after=1 << 20))  # the handler's thread exists
    files.clear()
    before, during = threading.active_count(), []
    status, sent, _ = asyncio.run(download_hashed(app, tmp_path / "w.bin", leave_after=1 << 20, threads=during))
    assert status == 200 and (1 << 20) <= sent < 2 << 20
    assert files[-1].closed
    assert files[-1].bytes_read < 2 << 20, f"{files[-1].bytes_read} of {size} bytes read for a client that left"
    assert during == [before] and threading.active_count() == before


@pytest.mark.django_db
@override_settings(ROOT_URLCONF=__name__, ALLOWED_HOSTS=["testserver"])
def test_the_test_clients_hand_a_download_over_unread(tmp_path):
    """Django's test clients (sync and async) read nothing of a file until the test iterates it."""
    from django.test import AsyncClient, Client

    big_file(tmp_path / "w.bin", 8)
    files.clear()
    response = Client().get("/download/", {"path": tmp_path / "w.bin"})
    assert response.streaming and response["Content-Length"] == str(8 << 20)
    assert getattr(files[-1], "bytes_read", 0) == 0
    first = next(iter(response.streaming_content))
    assert files[-1].bytes_read == len(first) == response.block_size
    response.close()
    response = asyncio.run(AsyncClient().get("/download/", {"path": tmp_path / "w.bin"}))
    assert response.streaming and getattr(files[-1], "bytes_read", 0) == 0
    response.close()
    assert all(f.closed for f in files)


def test_the_served_application_is_the_threaded_handler():
    from yoloportal import asgi

    assert isinstance(asgi.django_asgi_app, ThreadPoolASGIHandler)
