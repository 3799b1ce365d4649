"""A large download through the server we run (uvicorn, yoloportal.asgi:application): the file
goes out in blocks, read only as fast as the client takes them, and the web process's memory
stays a few blocks whatever the file's size (yoloportal/asgi_threads.py ``pulled``)."""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings

from tests.portal.liveweb import free_port
from yoloportal.env import database_url

pytestmark = pytest.mark.integration

SIZE = 128 << 20
# The most the server may read ahead of a client that stopped: the sockets' buffers (the client's
# 256 KiB receive buffer, the server's send buffer, autotuned up to net.ipv4.tcp_wmem's 4 MiB),
# the transport's write buffer and a block or two.
AHEAD = 16 << 20
KEY = "models/vision/big/v1/big.pt"


def sparse_weights(path: Path) -> str:
    """A sparse SIZE-byte file with each MiB numbered (a lost or repeated block changes the hash)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as out:
        out.truncate(SIZE)
        for n in range(SIZE >> 20):
            out.seek(n << 20)
            out.write(n.to_bytes(8, "big") * 4)
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def status_of(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM", "Threads"):
            fields[name] = int(value.split()[0])  # kB, or a count
    return fields


def open_position(pid: int, path: Path) -> int | None:
    """Where the server's open handle of ``path`` is (None: it has no handle open)."""
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            if os.readlink(fd) == str(path):
                return int(Path(f"/proc/{pid}/fdinfo/{fd.name}").read_text().split()[1])
        except FileNotFoundError:
            continue
    return None


def settled_position(pid: int, path: Path, still_s: float = 2.0, timeout: float = 60) -> int | None:
    """The server's read position in ``path`` once it has not moved for ``still_s``: the server
    stopped reading (the client is not reading and the buffers between are full). None: no handle.
    Fails if it keeps moving for ``timeout`` (a server reading on regardless of its client)."""
    deadline = time.monotonic() + timeout
    position, since = open_position(pid, path), time.monotonic()
    while time.monotonic() - since < still_s:
        assert time.monotonic() < deadline, f"the server kept reading ({position} of {SIZE} bytes) for {timeout} s"
        time.sleep(0.1)
        if (now := open_position(pid, path)) != position:
            position, since = now, time.monotonic()
    return position


class Download:
    """GET over a raw socket: the headers, then the body read block by block into a hash."""

    def __init__(self, port: int, path: str, token: str) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 256 << 10)  # no autotuning to many MiB
        self.sock.settimeout(30)
        self.sock.connect(("127.0.0.1", port))
        self.sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Token {token}\r\n"
                          "Connection: close\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.sock.recv(65536)
        head, _, self.pending = head.partition(b"\r\n\r\n")
        self.status = int(head.split()[1])
        self.digest, self.received = hashlib.sha256(), 0
        self.take(len(self.pending))

    def take(self, count: int) -> None:
        self.digest.update(self.pending)
        self.received += len(self.pending)
        while self.received < count and (block := self.sock.recv(1 << 20)):
            self.digest.update(block)
            self.received += len(block)
        self.pending = b""

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def web(transactional_db, tmp_path):
    """One uvicorn process (no --workers: the process measured is the one that serves)."""
    port = free_port()
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="yoloportal.settings", DATA_DIR=str(settings.DATA_DIR),
               MODELS_DIR=str(tmp_path / "models"), DATABASE_URL=database_url(settings.DATABASES["default"]),
               REDIS_URL=settings.REDIS_URL,
               WEB_THREADS="1")  # one request thread: any other thread that appears is a leak
    log = open(tmp_path / "web.log", "ab")
    process = subprocess.Popen([sys.executable, "-m", "uvicorn", "yoloportal.asgi:application", "--host", "127.0.0.1",
                                "--port", str(port), "--no-access-log"], cwd=settings.BASE_DIR, env=env,
                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 30
    try:
        while True:
            assert process.poll() is None, (tmp_path / "web.log").read_text()[-3000:]
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "uvicorn did not listen within 30 s"
                time.sleep(0.1)
        yield {"port": port, "pid": process.pid, "models": tmp_path / "models"}
    finally:
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
        log.close()


def test_a_large_weights_file_streams_with_backpressure_in_bounded_memory_and_a_leaving_client_frees_it(
        web, bob):
    from apps.accounts.services import token_create
    from apps.registry.models import ModelVersion

    path = web["models"] / "vision" / "big" / "v1" / "big.pt"
    sha256 = sparse_weights(path)
    version = ModelVersion.objects.create(team=bob.memberships.first().team, name="big", version=1, source="upload",
                                          weights_key=KEY, sha256=sha256, size=SIZE, uploaded_by=bob)
    _, token = token_create(user=bob)
    url, pid = f"/api/v1/models/{version.pk}/download/", web["pid"]

    # Warm the process (imports, the request thread, database and Redis connections) without a download:
    # memory a download once took stays with the process (the allocator keeps it), and would hide the next.
    warm = Download(web["port"], f"/api/v1/models/{version.pk}/", token)
    assert warm.status == 200
    warm.close()
    threads = status_of(pid)["Threads"]
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # peak RSS := RSS now
    before = status_of(pid)["VmRSS"]

    # The whole file, to a client that first stops reading for a while.
    download = Download(web["port"], url, token)
    assert download.status == 200
    # Read only as the client takes it: the position stops a few buffers ahead of what the client
    # took, and moves on, block by block, when it takes more (a whole-file read stops at SIZE, or closes).
    ahead = []
    for took in (1 << 20, 9 << 20, 17 << 20):
        download.take(took)
        position = settled_position(pid, path)
        assert position is not None, "the server closed the file before sending it all"
        ahead.append(position - download.received)
        assert 0 <= ahead[-1] < AHEAD, f"the server read {position} of {SIZE} bytes for a client that took {download.received}"
    print(f"read ahead of the client: {[f'{a / 2**20:.2f} MiB' for a in ahead]}")
    download.take(SIZE)
    download.close()
    assert (download.received, download.digest.hexdigest()) == (SIZE, sha256)

    # Clients that leave after their first MiB: each file is closed, no thread is left behind.
    for _ in range(3):
        leaving = Download(web["port"], url, token)
        assert leaving.status == 200
        leaving.take(1 << 20)
        leaving.close()
        deadline = time.monotonic() + 10
        while open_position(pid, path) is not None:
            assert time.monotonic() < deadline, "the file stayed open after its client left"
            time.sleep(0.05)

    grew = (status_of(pid)["VmHWM"] - before) << 10
    print(f"web process peak RSS growth: {grew / 2**20:.1f} MiB for downloads of {SIZE >> 20} MiB")
    assert grew < 24 << 20, f"the web process grew by {grew / 2**20:.0f} MiB serving a {SIZE >> 20} MiB file"
    assert status_of(pid)["Threads"] == threads
