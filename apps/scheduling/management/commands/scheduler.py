"""manage.py scheduler: the one active scheduler loop."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from datetime import timedelta

import redis
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import close_old_connections
from django.utils import timezone

from apps.core.migrated import NOT_MIGRATED, database_migrated, wait_until_migrated
from apps.core.redis_client import redis_client
from apps.core.redis_outage import (
    RETRY_S,
    connection_error_of,
    redis_is_down,
    redis_outage_consequence,
    redis_reachable,
    redis_unreachable,
)
from apps.monitoring.recorders import scheduler_pass_record
from apps.monitoring.services import utilisation_sample
from apps.scheduling.inputs import QueueRows
from apps.scheduling.kick import wait_for_kick
from apps.scheduling.leader import LeaderLease, LeadershipLost
from apps.scheduling.loop import reap_lost_nodes, reap_silent_attempts, tick
from yoloportal.logs import bind

log = logging.getLogger("yoloportal.scheduler")


UTILISATION_SAMPLE_S = 60.0
# A storage marker deleted by hand is back this soon (until then every node's heartbeat says its
# root is unreachable); four stat calls and one row read a minute cost nothing.
STORAGE_MARKS_EVERY_S = 60.0
_last_sample = -UTILISATION_SAMPLE_S


def timed_tick(token: int | None, rows: QueueRows | None = None) -> None:
    """One pass, its duration and end time recorded for /metrics (best effort, in Redis), and
    about once a minute a sample of the cluster for the hourly history (apps.monitoring)."""
    global _last_sample
    started = time.monotonic()
    tick(token=token, rows=rows)
    scheduler_pass_record(time.monotonic() - started)
    if started - _last_sample >= UTILISATION_SAMPLE_S:
        _last_sample = started
        utilisation_sample()


class Chores:
    """The leader's periodic chores, on a thread of their own, one run at a time:

    - every ``STORAGE_MARKS_EVERY_S``, first: the installation's marker into each shared root
      that lacks it (apps/core/storage_marks.py: the nodes' test of their mounts; this process
      owns it);
    - every ``LOG_ARCHIVE_EVERY_S``: cold logs into the artifact storage
      (apps/jobs/log_archive.py) and the notification delivery log pruned to 90 days;
      ended jobs' resume checkpoints out of the store (apps/jobs/checkpoint_retention.py);
    - every ``NOTIFY_CATCH_UP_S``: the notifications Redis lost (apps.notifications.tasks.catch_up),
      over a window that moves on from where the last run ended.

    Moving 50 jobs' logs (up to JOB_LOG_MAX_BYTES each) into a bucket takes seconds to
    minutes, and the planning loop must not stall for it (idle submit -> started <= 0.5 s).
    A second scheduler doing the same at the same moment is harmless: an archive is written
    whole under a fixed key before the chunks go, in one transaction, and notifications are
    made once per channel and cause. A chore that fails is logged and retried next time.
    """

    def __init__(self) -> None:
        self.last: dict[str, float] = {}
        self.notified_until = None  # where the next catch-up window starts (None: an hour back)
        self.thread: threading.Thread | None = None

    def every(self) -> dict[str, float]:
        return {"storage_marks": STORAGE_MARKS_EVERY_S, "logs": settings.LOG_ARCHIVE_EVERY_S, "checkpoints": settings.LOG_ARCHIVE_EVERY_S,
                "notifications": settings.NOTIFY_CATCH_UP_S}

    def maybe_start(self) -> None:
        if self.thread is not None and self.thread.is_alive():
            return
        now = time.monotonic()
        due = [name for name, every in self.every().items() if now - self.last.get(name, -float("inf")) >= every]
        if not due:
            return
        for name in due:
            self.last[name] = now
        self.thread = threading.Thread(target=self.run, args=(due,), name="chores", daemon=True)
        self.thread.start()

    def run(self, due: list[str]) -> None:
        from django.db import connections

        try:
            for name in due:
                try:
                    getattr(self, name)()
                except Exception as exc:  # noqa: BLE001 - a chore must never stop scheduling
                    if connection_error_of(exc) is not None:
                        redis_unreachable(exc)  # the loop's one outage line, not a traceback
                    else:
                        log.exception("%s chore failed; retried next time", name)
        finally:
            connections.close_all()  # this thread's own connections

    def storage_marks(self) -> None:
        from apps.core.storage_marks import storage_marks_write

        storage_marks_write()  # logs what it wrote, and a root it must not write into

    def logs(self) -> None:
        from apps.jobs.log_archive import logs_housekeeping
        from apps.notifications.tasks import prune_old

        done = logs_housekeeping(batch=50)
        if done["archived_jobs"] or done["deleted_archives"] or done["deleted_hot_jobs"]:
            log.info("log housekeeping: %s", done)
        pruned = prune_old()
        if pruned:
            log.info("notification deliveries older than 90 days deleted: %d", pruned)

    def checkpoints(self) -> None:
        from apps.jobs.checkpoint_retention import checkpoints_housekeeping

        done = checkpoints_housekeeping(batch=50)
        if done["deleted"] or done["jobs"] or done["orphan_prefixes"]:
            log.info("checkpoint retention: %s", done)

    def notifications(self, now=None) -> None:
        from apps.notifications.tasks import CATCH_UP_AFTER_S, catch_up

        until = (now or timezone.now()) - timedelta(seconds=CATCH_UP_AFTER_S)
        since = self.notified_until or until - timedelta(hours=1)
        done = catch_up(since, until)  # raises while Redis is down: the window stays for next time
        self.notified_until = until
        # Say what was made up for, and the likely cause of each, without claiming more: a
        # delivery never tried may only be waiting behind a busy notifications worker.
        if done["deliveries_created"]:
            log.warning("notifications caught up: %d deliveries no fan-out had made (its event was recorded "
                        "while Redis was down, or the notifications worker is far behind): %s",
                        done["deliveries_created"], done)
        if done["deliveries_requeued"]:
            log.warning("notifications caught up: %d deliveries not tried %ds after they were made queued again "
                        "(Redis lost them, or the notifications worker is far behind): %s",
                        done["deliveries_requeued"], CATCH_UP_AFTER_S, done)


class Command(BaseCommand):
    help = "Run the scheduler loop (wakes on kicks and every SCHEDULER_TICK_S seconds)."

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true",
                            help="take the leader lease, run one pass and exit (exit 3 if another scheduler leads)")

    def handle(self, *args, once: bool = False, **options):
        bind(component="scheduler")
        me = f"{socket.gethostname()}:{os.getpid()}"
        # Long enough to survive a slow pass; a standby takes over this long after a crash
        # (at once after a clean stop, which releases the lease).
        lease = LeaderLease(me, ttl_s=max(10.0, settings.SCHEDULER_TICK_S * 4))
        if once:
            if not database_migrated():
                raise CommandError(NOT_MIGRATED)
            if not lease.hold():
                self.stderr.write(f"another scheduler leads ({lease.current_holder()}); nothing done")
                raise SystemExit(3)
            try:
                timed_tick(lease.token)
            finally:
                lease.release()
            return
        # What the loop below does without Redis (the one WARNING of an outage says it).
        redis_outage_consequence(
            f"this scheduler plans nothing meanwhile (no job starts or is preempted) but still reaps lost nodes "
            f"and silent attempts; the leader lease ({lease.ttl_ms / 1000:g} s) lapses if the outage outlasts it, "
            f"and is taken again with a new fencing token once Redis is back")
        self.stopping = False
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        log.info("scheduler %s started (tick %.1f s, node grace %.0f s)", me, settings.SCHEDULER_TICK_S,
                 settings.NODE_GRACE_S)
        # Started before `manage.py migrate` (README's multi-node steps): one line a minute until
        # it has run, not a traceback every tick (multi-node trial M2).
        if not wait_until_migrated(log=log, stopping=lambda: self.stopping):
            log.info("scheduler %s stopped", me)
            return
        chores = Chores()
        rows = QueueRows()  # the queue kept between this leader's passes
        while not self.stopping:
            close_old_connections()
            try:
                if redis_is_down():
                    redis_client().ping()  # one try per round; "back" is said before the lease's lines
                    redis_reachable()
                if lease.hold():
                    timed_tick(lease.token, rows)
                    chores.maybe_start()
                    wait_for_kick(settings.SCHEDULER_TICK_S)
                else:
                    time.sleep(settings.SCHEDULER_TICK_S)
            except LeadershipLost as exc:
                log.warning("scheduler %s stops acting: %s", me, exc)
                lease.value = lease.token = None
            except redis.RedisError as exc:
                # Without Redis nothing can be dispatched, but reaping still matters.
                # Planning is skipped too: without the leader lease two schedulers could
                # both try to allocate. Reaping is a set of conditional updates, safe to run anyway.
                # An outage is one WARNING and one INFO when it ends (apps/core/redis_outage.py),
                # not a line every round.
                if connection_error_of(exc) is not None:
                    redis_unreachable(exc)
                else:
                    log.warning("Redis unavailable: %s", exc)
                reap_lost_nodes()
                reap_silent_attempts()
                time.sleep(min(settings.SCHEDULER_TICK_S, RETRY_S))
            except Exception:
                log.exception("scheduler pass failed; retrying")
                time.sleep(1.0)
        lease.release()
        log.info("scheduler %s stopped", me)

    def stop(self, *_):
        self.stopping = True
