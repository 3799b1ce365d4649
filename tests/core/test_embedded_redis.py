"""manage.py embedded_redis (make run's Redis) stops last: at SIGTERM it serves until its other
clients have gone (they stop at the same signal and still need Redis on their way out), then
shuts down. (SIGKILLed, its redis-server goes too: PR_SET_PDEATHSIG, checked by hand.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import redis
from django.conf import settings

from apps.core.redis_server import wait_until_ready
from tests.s3 import free_port


def test_it_serves_its_clients_out_after_sigterm_then_stops(tmp_path):
    port = free_port()
    env = {**os.environ, "DATA_DIR": str(tmp_path), "EMBEDDED_REDIS_PORT": str(port)}
    command = subprocess.Popen([sys.executable, "manage.py", "embedded_redis"], cwd=settings.BASE_DIR, env=env,
                               stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_until_ready(port, timeout=30)
        client = redis.Redis(host="127.0.0.1", port=port)
        client.set("k", "v")
        os.killpg(command.pid, signal.SIGTERM)  # as honcho stops every process at Ctrl-C
        time.sleep(0.5)
        assert command.poll() is None and client.get("k") == b"v"  # an RQ worker's register_death, say
        client.close()
        assert command.wait(10) == 0
        with pytest.raises(redis.ConnectionError):
            redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=1).ping()
    finally:
        if command.poll() is None:
            os.killpg(command.pid, signal.SIGKILL)
            command.wait()

