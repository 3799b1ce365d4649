from __future__ import annotations

import time

import redis
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Wait until Redis (REDIS_URL) answers PING."

    def add_arguments(self, parser):
        parser.add_argument("--timeout", type=float, default=30.0)

    def handle(self, *args, timeout: float, **options):
        client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=1)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                client.ping()
                return
            except redis.RedisError:
                time.sleep(0.2)
        raise CommandError(f"Redis at {settings.REDIS_URL} did not answer within {timeout:.0f} s")
