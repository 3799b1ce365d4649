"""A real web server (uvicorn with two worker processes, as `make run` serves the ASGI app with
Channels) on the test database, for CLI and
browser tests. It shares the session's Redis, so the test process can publish to its sockets."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings

from tests.integration.live import LiveSystem


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WebServer:
    def __init__(self, system: LiveSystem, log_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        log = open(log_dir / "web.log", "ab")
        self.log_path = log_dir / "web.log"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "yoloportal.asgi:application", "--host", "127.0.0.1",
             "--port", str(self.port), "--workers", "2"],
            cwd=settings.BASE_DIR, env=system.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"uvicorn exited: {self.log()[-3000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("uvicorn did not start listening within 30 s")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.process.pid, signal.SIGKILL)
