"""RQ's records about a lost Redis become one WARNING per outage and one INFO when it is back;
every other RQ record, a job's real exception above all, is logged as before (trial M12)."""

from __future__ import annotations

import logging

import pytest
import redis
from django.conf import settings
from rq import Queue, Worker

from apps.core import redis_outage

rq_worker = logging.getLogger("rq.worker")


@pytest.fixture(autouse=True)
def redis_up():
    redis_outage.redis_reachable()
    yield
    redis_outage.redis_reachable()


def lost_while_monitoring() -> BaseException:
    """The chain RQ's monitor raised in the trial: the heartbeat's ConnectionError inside its timeout."""
    try:
        try:
            raise TimeoutError("Task exceeded maximum timeout value (30 seconds)")
        except TimeoutError:
            raise redis.exceptions.ConnectionError("Connection closed by server.") from None
    except redis.exceptions.ConnectionError as exc:
        return exc


def messages(caplog) -> list[tuple[str, str]]:
    return [(record.levelname, record.getMessage()) for record in caplog.records]


def test_it_turns_rqs_connection_errors_into_one_warning_and_one_line_when_back(caplog):
    lost = lost_while_monitoring()
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            rq_worker.error("Worker w: found an unhandled exception, quitting...", exc_info=lost)
        try:
            raise redis.exceptions.ConnectionError("Error 111 connecting")
        except redis.exceptions.ConnectionError:
            rq_worker.error("Worker w: could not connect to Redis instance: retrying in 2 seconds...")
        redis_outage.redis_reachable()
        redis_outage.redis_reachable()
    logged = messages(caplog)
    assert [level for level, _ in logged] == ["WARNING", "INFO"], logged
    assert logged[0][1].startswith("Redis unreachable at ") and "retrying" in logged[0][1]
    assert logged[1][1].startswith("Redis reachable again at ")


def test_it_logs_every_other_rq_error_with_its_traceback(caplog):
    with caplog.at_level(logging.INFO):
        try:
            raise ValueError("the job's own bug")
        except ValueError:
            rq_worker.exception("Worker w: job j raised")
    assert [(record.levelname, record.exc_info[0]) for record in caplog.records] == [("ERROR", ValueError)]


class Slot(redis_outage.OutageTolerantWorker, Worker):
    """Our RQ worker classes' mixin on RQ's worker (gpu_worker's NodeWorker, notify_worker's)."""


def test_a_busy_workers_command_thread_says_redis_is_back_on_its_next_retry(caplog, monkeypatch):
    """Not at the worker's next job-monitoring heartbeat, up to 30 s after Redis is back."""
    monkeypatch.setattr(redis_outage, "RETRY_S", 0.01)
    connection = redis.Redis.from_url(settings.REDIS_URL)
    slot = Slot([Queue("redis-outage-test", connection=connection)], connection=connection)
    lost = redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
    with caplog.at_level(logging.INFO):
        # RQ's pubsub thread calls this each time it fails to reconnect; Redis (this session's) answers now.
        slot._pubsub_exception_handler(lost, None, None)
    logged = messages(caplog)
    assert [level for level, _ in logged] == ["WARNING", "INFO"], logged
    assert logged[1][1].startswith("Redis reachable again at ")


def test_a_worker_exits_without_waiting_for_its_command_thread():
    """RQ 3.0 unsubscribes, then stops the command-channel thread, which redis-py 8.2 waits for. A
    thread that read the UNSUBSCRIBE reply before it was told to stop sat 60 s waiting for a new
    subscription: a race, lost often under load (CI: most notification tests, each a burst drain,
    took 60 s). Here the thread always reads the reply first."""
    import time

    from rq import SimpleWorker

    class Drain(redis_outage.OutageTolerantWorker, SimpleWorker):
        def subscribe(self):
            super().subscribe()
            unsubscribe = self.pubsub.unsubscribe

            def unsubscribe_and_let_the_thread_read_the_reply(*args, **kwargs):
                answer = unsubscribe(*args, **kwargs)
                deadline = time.monotonic() + 5
                while self.pubsub.subscribed and time.monotonic() < deadline:
                    time.sleep(0.01)
                time.sleep(0.1)  # the thread back in its loop
                return answer

            self.pubsub.unsubscribe = unsubscribe_and_let_the_thread_read_the_reply

    connection = redis.Redis.from_url(settings.REDIS_URL)
    started = time.monotonic()
    Drain([Queue("redis-outage-test", connection=connection)], connection=connection).work(burst=True)
    assert time.monotonic() - started < 10  # 60 s on the stuck thread; about 0.2 s here
