"""Values that only the scheduler or a worker sees, kept in Redis for the web process's /metrics.

Why Redis and not each process's own ``prometheus_client`` registry: web, scheduler and
workers are separate processes (workers on other machines, RQ work-horses forked and gone
after each job). Prometheus would have to find and scrape every one of them, and a
work-horse's metrics die with it. Instead each writer does a couple of O(1) Redis
commands (HINCRBY on a bucket) and ``/metrics`` reads the hashes at scrape time
(apps/monitoring/collector.py). Counters kept here restart from zero if Redis loses its
data; Prometheus' ``rate()`` treats that as a counter reset, which is what it is.

Every function here is best effort: a Redis error is logged and swallowed, so a metric
never fails a scheduling pass or a training attempt.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import redis

from apps.core.redis_client import redis_client
from apps.core.redis_outage import redis_reachable, redis_use_failed

log = logging.getLogger(__name__)
PREFIX = "yoloportal:metrics:"
LAST_PASS_KEY = PREFIX + "scheduler_last_pass"
GPU_FREED_KEY = PREFIX + "gpu_freed"  # hash "<node>:<gpu>" -> unix time the GPU was freed while jobs waited
WS_CLIENTS_KEY = PREFIX + "ws_clients"  # sorted set: channel name -> connect time
GPU_FREED_TTL_S = 6 * 3600
WS_STALE_S = 12 * 3600


@dataclass(frozen=True)
class RedisHistogram:
    """A label-less histogram whose buckets live in one Redis hash (non-cumulative counts)."""

    key: str
    buckets: tuple[float, ...]

    def observe(self, value: float, client: redis.Redis | None = None) -> None:
        index = bisect.bisect_left(self.buckets, value)
        bucket = repr(self.buckets[index]) if index < len(self.buckets) else "+Inf"
        try:
            pipe = (client or redis_client()).pipeline(transaction=False)
            pipe.hincrby(self.key, bucket, 1)
            pipe.hincrbyfloat(self.key, "sum", value)
            pipe.execute()
        except redis.RedisError as exc:
            log.debug("metric %s not recorded: %s", self.key, exc)

    def read(self, client: redis.Redis) -> tuple[list[tuple[str, float]], float]:
        """Cumulative (le, count) pairs ending with +Inf, and the sum of observations."""
        raw = {k.decode(): float(v) for k, v in client.hgetall(self.key).items()}
        cumulative, running = [], 0.0
        for edge in (*[repr(b) for b in self.buckets], "+Inf"):
            running += raw.get(edge, 0.0)
            cumulative.append((edge, running))
        return cumulative, raw.get("sum", 0.0)


SCHEDULER_PASS = RedisHistogram(PREFIX + "scheduler_pass_seconds",
                                (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0))
DISPATCH_LATENCY = RedisHistogram(PREFIX + "dispatch_latency_seconds",
                                  (0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 900.0))


def scheduler_pass_record(duration_s: float, *, finished_at: float | None = None) -> None:
    """Called by the scheduler loop after each full pass."""
    SCHEDULER_PASS.observe(duration_s)
    try:
        redis_client().set(LAST_PASS_KEY, repr(finished_at or time.time()))
    except redis.RedisError as exc:
        log.debug("last pass time not recorded: %s", exc)


def gpus_freed(node: str, gpu_indices: Iterable[int], *, jobs_waiting: bool, at: float | None = None) -> None:
    """An attempt stopped holding these GPUs. Only a GPU freed while jobs wait starts the clock:
    an idle cluster's next start hours later says nothing about dispatch speed."""
    indices = list(gpu_indices)
    if not indices:
        return
    try:
        client = redis_client()
        if not jobs_waiting:
            client.hdel(GPU_FREED_KEY, *[f"{node}:{i}" for i in indices])
            return
        client.hset(GPU_FREED_KEY, mapping={f"{node}:{i}": repr(at or time.time()) for i in indices})
        client.expire(GPU_FREED_KEY, GPU_FREED_TTL_S)
    except redis.RedisError as exc:
        log.debug("GPU freed time not recorded: %s", exc)


def training_started(node: str, gpu_indices: Sequence[int], *, at: float | None = None) -> float | None:
    """A training process started on these GPUs: observe (start − the last of them freed), once."""
    fields = [f"{node}:{i}" for i in gpu_indices]
    if not fields:
        return None
    try:
        client = redis_client()
        pipe = client.pipeline()
        pipe.hmget(GPU_FREED_KEY, fields)
        pipe.hdel(GPU_FREED_KEY, *fields)
        freed, _ = pipe.execute()
    except redis.RedisError as exc:
        log.debug("dispatch latency not recorded: %s", exc)
        return None
    marks = [float(v) for v in freed if v is not None]
    if not marks:
        return None  # the GPUs were idle already: nothing waited on them
    latency = max(0.0, (at or time.time()) - max(marks))
    DISPATCH_LATENCY.observe(latency)
    return latency


def websocket_connected(channel_name: str) -> None:
    try:
        redis_client().zadd(WS_CLIENTS_KEY, {channel_name: time.time()})
    except redis.RedisError as exc:
        log.debug("websocket client not counted: %s", exc)


def websocket_disconnected(channel_name: str) -> None:
    try:
        redis_client().zrem(WS_CLIENTS_KEY, channel_name)
    except redis.RedisError as exc:
        log.debug("websocket client not uncounted: %s", exc)


def websocket_clients(client: redis.Redis) -> int:
    """Open sockets across every web process. A web process that died without closing its
    sockets leaves entries behind; they age out after WS_STALE_S (a session's lifetime)."""
    client.zremrangebyscore(WS_CLIENTS_KEY, "-inf", time.time() - WS_STALE_S)
    return int(client.zcard(WS_CLIENTS_KEY))


def last_pass_time(client: redis.Redis) -> float | None:
    value = client.get(LAST_PASS_KEY)
    return float(value) if value else None


# A pass runs every SCHEDULER_TICK_S (3 s); none for this long and the scheduler is not planning
# (the same minute as the YoloportalSchedulerNotPlanning alert).
SCHEDULER_SILENT_S = 60


def scheduler_status(*, now: float | None = None) -> dict:
    """Whether the scheduler is planning, for the people who wait on it: while it is stopped the
    queue kept counting down estimates already past, and nothing said why (multi-node trial M9).

    ``planning``: True (a pass within ``SCHEDULER_SILENT_S``), False (none since ``last_pass_at``,
    or none ever recorded), None (Redis, where passes are recorded, does not answer). ``note``:
    a sentence to show beside the queue when it is not True, else ''.
    """
    now = time.time() if now is None else now
    try:
        last = last_pass_time(redis_client())
    except redis.RedisError as exc:
        redis_use_failed(exc)  # one line per process and outage (apps/core/redis_outage.py)
        return {"planning": None, "last_pass_at": None, "seconds_since": None,
                "note": "whether the scheduler is planning is unknown (Redis does not answer)"}
    redis_reachable()
    if last is None:
        return {"planning": False, "last_pass_at": None, "seconds_since": None,
                "note": "the scheduler has not planned yet: queued jobs wait for it (is `manage.py scheduler` running?)"}
    since = max(0.0, now - last)
    at = datetime.fromtimestamp(last, tz=UTC)
    planning = since <= SCHEDULER_SILENT_S
    note = "" if planning else (
        f"the scheduler has not planned since {at:%H:%M:%S} UTC ({since / 60:.0f} min ago): queued jobs wait for it "
        "and their estimates are stale (is `manage.py scheduler` running?)")
    return {"planning": planning, "last_pass_at": at.isoformat(), "seconds_since": round(since), "note": note}
