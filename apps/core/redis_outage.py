"""A Redis outage in an RQ process (GPU-worker slots, notify_worker): one line down, one line back.

RQ logs a lost connection as errors: every retry of an idle worker's dequeue ("could not connect
to Redis instance", ~150 lines a minute on a node), and a busy worker whose job-monitoring
heartbeat failed as "found an unhandled exception, quitting..." with a HorseMonitorTimeoutException
→ ConnectionError traceback, while its work-horse went on training (trial M12). An operator reads
crashes where nothing crashed. Here:

1. :class:`QuietRedisOutage`, a logging filter on RQ's loggers (yoloportal/logs.py), drops the
   records whose exception is a Redis connection error and reports the outage instead; every
   other record (a job's real exception included) passes untouched.
2. :func:`redis_unreachable` logs one WARNING per process per outage, :func:`redis_reachable`
   one INFO when a command succeeds again.
3. :class:`OutageTolerantWorker`, mixed into our RQ worker classes, keeps monitoring a running
   work-horse through the outage (its heartbeat waits for Redis) instead of leaving it, and
   says when Redis is back.
4. :class:`OutageTolerantScheduler`: RQ's scheduler process (notify_worker's delayed retries)
   waits for Redis instead of dying with a traceback.

Our own loops (``manage.py scheduler``) call the two functions themselves, and
:func:`redis_is_down` tells them to probe Redis before anything else while it is away.

A web process has no loop of its own: each Redis use on a request's path (the scheduler kick,
the throttle counters, a notification's enqueue, /readyz, /metrics, the queue's scheduler
status) reports a connection error to :func:`redis_unreachable` instead of a line per request,
and its next success to :func:`redis_reachable` ("back" on the next request that reached Redis;
no thread polls). Its WARNING says :data:`WEB_CONSEQUENCE` (set by yoloportal/asgi.py).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from urllib.parse import urlsplit

import redis
from rq.scheduler import RQScheduler

log = logging.getLogger("yoloportal.redis")
CONNECTION_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)

# How often a process tries Redis again while it is away: each try is one connection attempt,
# and the line that Redis is back comes within about this long of its return.
RETRY_S = 2.0

_down_since: float | None = None  # per process: children forked during an outage inherit it
_back_at: float | None = None  # when this process last said Redis is back
_goes_on = "work goes on"
_lock = threading.Lock()  # a web process's request threads report at once: still one line each way

# What a web process still does while Redis is away (each true of the code: submits and cancels
# are database writes; the throttles fail open, apps.accounts.throttles; the scheduler plans
# nothing until Redis is back; notifications lost meanwhile are redone by its catch-up).
WEB_CONSEQUENCE = ("submits and cancels are still stored (queued jobs start once it is back and the scheduler "
                   "plans again); rate limits are not enforced, live page updates pause, and notifications "
                   "are sent once it is back")


def redis_outage_consequence(text: str) -> None:
    """What this process keeps doing while Redis is away, for the WARNING ("training goes on")."""
    global _goes_on
    _goes_on = text


def redis_address() -> str:
    from django.conf import settings

    parts = urlsplit(settings.REDIS_URL)
    return f"{parts.hostname or 'localhost'}:{parts.port or 6379}" if parts.scheme != "unix" else parts.path


def redis_unreachable(exc: BaseException) -> None:
    global _down_since
    with _lock:
        first = _down_since is None
        if first:
            _down_since = time.monotonic()
    if first:
        log.warning("Redis unreachable at %s (%s); %s, retrying", redis_address(), exc, _goes_on)


def redis_is_down() -> bool:
    """Whether this process last found Redis unreachable (and has not said it is back since)."""
    return _down_since is not None


def redis_reachable() -> None:
    global _down_since, _back_at
    if _down_since is None:  # the common case, on every request: no lock taken
        return
    with _lock:
        since = _down_since
        if since is not None:
            _down_since, _back_at = None, time.monotonic()
    if since is not None:
        log.info("Redis reachable again at %s after %d s", redis_address(), time.monotonic() - since)


def redis_was_down_within(seconds: float) -> bool:
    """Whether Redis is away, or came back less than ``seconds`` ago (as this process saw it)."""
    return _down_since is not None or (_back_at is not None and time.monotonic() - _back_at <= seconds)


def redis_use_failed(exc: BaseException) -> bool:
    """For a Redis use that goes on without Redis: True (and the outage reported, once) if
    ``exc`` is Redis being unreachable; False for any other error, which the caller logs itself."""
    lost = connection_error_of(exc)
    if lost is None:
        return False
    redis_unreachable(lost)
    return True


def connection_error_of(exc: BaseException | None) -> BaseException | None:
    """The Redis connection error in ``exc``'s chain (RQ raises it inside its monitor's timeout)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, CONNECTION_ERRORS):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


class QuietRedisOutage(logging.Filter):
    """On RQ's loggers: a record about a lost Redis connection becomes the one outage line.

    RQ logs some of them with ``exc_info`` and some inside the ``except`` block with the error
    in the text only, so the exception being handled counts too."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else sys.exc_info()[1]
        lost = connection_error_of(exc)
        if lost is None:
            return True
        redis_unreachable(lost)
        return False


class OutageTolerantWorker:
    """Mixed into an RQ ``Worker``: a heartbeat that fails while a work-horse runs is skipped
    (the next one, ``job_monitoring_interval`` later, tries again); RQ would leave the horse
    running unwatched and start over with a new worker that dequeues more work beside it.

    An idle worker retries its dequeue every 2 s, not RQ's backoff to 60 s: its retries are
    silent now, and work sent once Redis is back should not wait a minute for it.

    The worker's command-channel thread (pubsub) reconnects every 2 s as well; here it also
    pings, so a worker busy with a job says Redis is back within seconds, not at its next
    job-monitoring heartbeat (RQ's ``job_monitoring_interval``, 30 s)."""

    max_connection_wait_time = RETRY_S

    def heartbeat(self, *args, **kwargs):
        result = super().heartbeat(*args, **kwargs)
        if kwargs.get("pipeline") is None and (len(args) < 2 or args[1] is None):
            redis_reachable()  # written, not queued in a pipeline: Redis answered
        return result

    def maintain_heartbeats(self, job, execution):
        try:
            super().maintain_heartbeats(job, execution)
        except CONNECTION_ERRORS as exc:
            redis_unreachable(exc)
        else:
            redis_reachable()

    def _pubsub_exception_handler(self, exc, pubsub, pubsub_thread) -> None:
        if not isinstance(exc, redis.exceptions.ConnectionError):
            return super()._pubsub_exception_handler(exc, pubsub, pubsub_thread)
        redis_unreachable(exc)
        time.sleep(RETRY_S)  # RQ's pace: the thread then reconnects (and subscribes again)
        try:
            self.connection.ping()
        except redis.RedisError:  # still away (or answering oddly: RQ's own calls will say so)
            return
        redis_reachable()

    def unsubscribe(self):
        """RQ (3.0) sends UNSUBSCRIBE, then stops the command-channel thread. redis-py 8.2's
        ``PubSubWorkerThread.stop()`` waits for the thread, and a thread that read the reply
        before its flag was cleared sits in ``get_message`` waiting for a new subscription for
        RQ's ``sleep_time``, 60 s: every worker's exit (and every burst drain) could hang a
        minute (CI: the notification tests took 60 s each). Clearing the flag first lets the
        reply end the thread at once."""
        thread = self.pubsub_thread
        if thread is not None:
            try:
                thread.stop(timeout=0)  # clears the flag; does not wait
            except TypeError:  # redis-py before 8.2: stop() takes no timeout and never waits
                thread.stop()
        super().unsubscribe()

    def _start_scheduler(self, burst: bool = False, logging_level: str | None = "INFO", *args, **kwargs):
        self.scheduler = OutageTolerantScheduler(
            self.queues, connection=self.connection,
            logging_level=logging_level if logging_level is not None else self.log.level,
            serializer=self.serializer,
        )
        self.scheduler.acquire_locks()
        if self.scheduler.acquired_locks:
            if burst:
                try:
                    self.scheduler.register_birth()
                    self.scheduler.enqueue_scheduled_jobs()
                finally:
                    self.scheduler.release_locks()
                    self.scheduler.register_death()
            else:
                self.scheduler.start()


class OutageTolerantScheduler(RQScheduler):
    """RQ's scheduler loop (rq.scheduler.RQScheduler.work), waiting out a Redis outage."""

    def work(self):
        self._install_signal_handlers()
        self.register_birth()
        while not self._stop_requested:
            try:
                if self.should_reacquire_locks:
                    self.acquire_locks()
                self.heartbeat()
                self.enqueue_scheduled_jobs()
            except CONNECTION_ERRORS as exc:
                redis_unreachable(exc)
            else:
                redis_reachable()
            time.sleep(self.interval)
        self.stop()
