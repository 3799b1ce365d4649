"""Finding 5: oversized request bodies are refused with 413 before they are read — by the ASGI
middleware (any server) and inside Daphne, which otherwise receives a whole body before the app
runs. Checked against real daphne and uvicorn processes over raw sockets."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from django.conf import settings

from tests.portal.liveweb import free_port

UPLOAD_LIMIT = 8 * 1024  # DATASET_UPLOAD_MAX_BYTES for the servers below
SPEC_LIMIT = 1024  # SPEC_MAX_BYTES


# --- the middleware alone, driven with ASGI messages -----------------------------------------


def run_asgi(path: str, headers: list[tuple[bytes, bytes]], chunks: list[bytes]):
    from yoloportal.body_limit import BodyLimitMiddleware

    received, sent, reads = [], [], []

    async def app(scope, receive, send):
        while True:
            message = await receive()
            received.append(message)
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def receive():
        reads.append(1)
        body = chunks[len(reads) - 1]
        return {"type": "http.request", "body": body, "more_body": len(reads) < len(chunks)}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "headers": headers}
    asyncio.run(BodyLimitMiddleware(app)(scope, receive, send))
    return sent[0]["status"], len(reads), received


def test_the_middleware_refuses_a_declared_length_without_reading(settings):
    settings.DATASET_UPLOAD_MAX_BYTES = UPLOAD_LIMIT
    huge = str(50 * 1024**3).encode()
    status, reads, _ = run_asgi("/api/v1/datasets/", [(b"content-length", huge)], [b"x"])
    assert (status, reads) == (413, 0)


def test_the_middleware_stops_a_chunked_body_once_past_the_limit(settings):
    settings.DATASET_UPLOAD_MAX_BYTES = UPLOAD_LIMIT
    chunks = [b"x" * 1024**2] * 10  # 10 MiB against a limit of 8 KiB + 1 MiB of multipart slack
    status, reads, received = run_asgi("/api/v1/datasets/", [], chunks)
    assert status == 413 and reads == 2 and received == [{"type": "http.request", "body": chunks[0],
                                                           "more_body": True}]


def test_the_middleware_passes_bodies_within_the_limit(settings):
    status, reads, received = run_asgi("/api/v1/jobs/", [(b"content-length", b"10")], [b"0123456789"])
    assert (status, reads) == (200, 1)


@pytest.mark.parametrize(("path", "expected"), [
    ("/api/v1/datasets/", "DATASET_UPLOAD_MAX_BYTES"), ("/api/v1/jobs/", "SPEC_MAX_BYTES"),
    ("/jobs/new/", "SPEC_MAX_BYTES"), ("/accounts/login/", "REQUEST_MAX_BYTES"),
])
def test_each_path_has_its_limit(path, expected, settings):
    from yoloportal.body_limit import body_limit_for

    settings.DATASET_UPLOAD_MAX_BYTES, settings.SPEC_MAX_BYTES, settings.REQUEST_MAX_BYTES = 10**6, 10**4, 10**5
    limits = {"DATASET_UPLOAD_MAX_BYTES": 10**6 + 1024**2, "SPEC_MAX_BYTES": 2 * 10**4 + 64 * 1024,
              "REQUEST_MAX_BYTES": 10**5}
    assert body_limit_for(path) == limits[expected]


# --- real servers --------------------------------------------------------------------------------


class Server:
    def __init__(self, kind: str, log_path) -> None:
        self.port = free_port()
        env = dict(os.environ, DJANGO_SETTINGS_MODULE="yoloportal.settings", DATA_DIR=str(settings.DATA_DIR),
                   DATABASE_URL=f"sqlite:///{settings.DATABASES['default']['NAME']}", REDIS_URL=settings.REDIS_URL,
                   DATASET_UPLOAD_MAX_BYTES=str(UPLOAD_LIMIT), SPEC_MAX_BYTES=str(SPEC_LIMIT))
        command = ([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port)] if kind == "daphne" else
                   [sys.executable, "-m", "uvicorn", "--host", "127.0.0.1", "--port", str(self.port)])
        self.log = open(log_path, "ab")
        self.process = subprocess.Popen([*command, "yoloportal.asgi:application"], cwd=settings.BASE_DIR, env=env,
                                        stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.process.poll() is None, open(log_path).read()[-3000:]
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"{kind} did not listen within 30 s")

    def stop(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.log.close()

    def connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        sock.settimeout(10)
        return sock


def read_response(sock: socket.socket) -> bytes:
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return data


@pytest.fixture(params=["daphne", "uvicorn"])
def server(request, transactional_db, tmp_path):
    running = Server(request.param, tmp_path / f"{request.param}.log")
    yield running
    running.stop()




@pytest.mark.integration
@pytest.mark.parametrize("path", ["/api/v1/datasets/", "/api/v1/jobs/", "/accounts/login/"])
def test_a_declared_length_over_the_limit_is_answered_before_the_body_is_sent(server, path):
    """Only the headers go out; the 413 comes back while the client has sent no body at all."""
    sock = server.connect()
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/octet-stream\r\n"
                 f"Content-Length: {50 * 1024**3}\r\n\r\n".encode())
    response = read_response(sock)
    sock.close()
    assert response.startswith(b"HTTP/1.1 413"), response[:300]
    assert b"limit" in response


@pytest.mark.integration
def test_a_chunked_body_past_the_limit_is_cut_off(server):
    """No Content-Length: the server counts and answers 413 once past the limit, and stops reading."""
    sock = server.connect()
    sock.sendall(b"POST /api/v1/jobs/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/yaml\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n")
    piece = b"#" * 16 * 1024
    sent = 0
    sock.setblocking(False)
    answered = b""
    for _ in range(200):  # up to 3.2 MiB against a limit of 2 KiB + 64 KiB
        try:
            answered = sock.recv(65536)
            if answered:
                break
        except BlockingIOError:
            pass
        try:
            sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
            sent += len(piece)
        except (BrokenPipeError, ConnectionResetError, BlockingIOError):
            break
        time.sleep(0.02)
    sock.setblocking(True)
    response = answered + read_response(sock)
    sock.close()
    assert response.startswith(b"HTTP/1.1 413"), (sent, response[:300])
    assert sent < 1024**2, f"the server kept reading: {sent} bytes sent before the answer"


@pytest.mark.integration
def test_a_body_within_the_limit_still_reaches_the_app(server):
    sock = server.connect()
    body = b"task_name: x\n"
    sock.sendall(b"POST /api/v1/jobs/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/yaml\r\n"
                 b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    response = read_response(sock)
    sock.close()
    assert response.startswith(b"HTTP/1.1 401") or response.startswith(b"HTTP/1.1 403"), response[:300]
