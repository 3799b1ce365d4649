from __future__ import annotations

import os
import time
from pathlib import Path

import redis
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Wait until Redis (REDIS_URL) answers PING; with make run's embedded Redis, that it is this installation's."

    def add_arguments(self, parser):
        parser.add_argument("--timeout", type=float, default=30.0)

    def handle(self, *args, timeout: float, **options):
        client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=1)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                client.ping()
            except redis.RedisError:
                time.sleep(0.2)
                continue
            embedded_check(client)
            return
        raise CommandError(f"Redis at {settings.REDIS_URL} did not answer within {timeout:.0f} s")


def embedded_check(client: redis.Redis) -> None:
    """Without REDIS_URL, the Redis on EMBEDDED_REDIS_PORT must be the one ``manage.py embedded_redis``
    starts in this DATA_DIR (its ``dir``). Another installation's on that port answered PING at once,
    so a second ``make run`` on the same port started its web, scheduler and worker against the first
    one's queues until honcho stopped them, its own redis-server having failed "Address already in use"
    (optrial24). A Redis that will not say its ``dir`` (CONFIG renamed) is taken as it is."""
    if os.environ.get("REDIS_URL"):
        return
    try:
        found = client.config_get("dir").get("dir")
    except redis.RedisError:
        return
    expected = (Path(settings.DATA_DIR) / "redis").resolve()
    if found and Path(found).resolve() != expected:
        raise CommandError(
            f"the Redis answering on 127.0.0.1:{settings.EMBEDDED_REDIS_PORT} is not this installation's: its data "
            f"folder is {found}, this one's embedded Redis keeps {expected}. Another installation (make run with "
            f"another DATA_DIR) holds that port: set EMBEDDED_REDIS_PORT to a free port, or REDIS_URL to share a "
            f"Redis on purpose")
