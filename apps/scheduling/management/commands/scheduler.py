"""manage.py scheduler: the one active scheduler loop."""

from __future__ import annotations

import logging
import os
import signal
import socket
import time

import redis
from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import close_old_connections

from apps.core.redis_client import redis_client
from apps.monitoring.recorders import scheduler_pass_record
from apps.monitoring.services import utilisation_sample
from apps.scheduling.kick import wait_for_kick
from apps.scheduling.loop import reap_lost_nodes, reap_silent_attempts, tick
from yoloportal.logs import bind

log = logging.getLogger("yoloportal.scheduler")
LEADER_KEY = "yoloportal:scheduler:leader"


UTILISATION_SAMPLE_S = 60.0
_last_sample = -UTILISATION_SAMPLE_S


def timed_tick() -> None:
    """One pass, its duration and end time recorded for /metrics (best effort, in Redis), and
    about once a minute a sample of the cluster for the hourly history (apps.monitoring)."""
    global _last_sample
    started = time.monotonic()
    tick()
    scheduler_pass_record(time.monotonic() - started)
    if started - _last_sample >= UTILISATION_SAMPLE_S:
        _last_sample = started
        utilisation_sample()


class Command(BaseCommand):
    help = "Run the scheduler loop (wakes on kicks and every SCHEDULER_TICK_S seconds)."

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="run one pass and exit")

    def handle(self, *args, once: bool = False, **options):
        bind(component="scheduler")
        if once:
            timed_tick()
            return
        self.stopping = False
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        me = f"{socket.gethostname()}:{os.getpid()}"
        log.info("scheduler %s started (tick %.1f s, node grace %.0f s)", me, settings.SCHEDULER_TICK_S,
                 settings.NODE_GRACE_S)
        while not self.stopping:
            close_old_connections()
            try:
                if self.lead(me):
                    timed_tick()
                    wait_for_kick(settings.SCHEDULER_TICK_S)
                else:
                    time.sleep(settings.SCHEDULER_TICK_S)
            except redis.RedisError as exc:
                # Without Redis nothing can be dispatched, but reaping still matters.
                # Planning is skipped too: without the leader lease two schedulers could
                # both allocate. Reaping is a set of conditional updates, safe to run anyway.
                log.warning("Redis unavailable: %s", exc)
                reap_lost_nodes()
                reap_silent_attempts()
                time.sleep(min(settings.SCHEDULER_TICK_S, 2.0))
            except Exception:
                log.exception("scheduler pass failed; retrying")
                time.sleep(1.0)
        log.info("scheduler %s stopped", me)

    def lead(self, me: str) -> bool:
        """Hold a short lease so that only one scheduler acts at a time."""
        client = redis_client()
        ttl = max(10, int(settings.SCHEDULER_TICK_S * 4))
        if client.set(LEADER_KEY, me, nx=True, ex=ttl):
            return True
        if (client.get(LEADER_KEY) or b"").decode() == me:
            client.expire(LEADER_KEY, ttl)
            return True
        return False

    def stop(self, *_):
        self.stopping = True
