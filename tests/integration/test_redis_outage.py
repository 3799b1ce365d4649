"""A Redis outage longer than RQ's job-monitoring interval (30 s) while a node trains (trial M12):
the worker, notify_worker and scheduler logs say so in a line per process and that it is back
(within seconds of its return), with no RQ "quitting" or traceback, and the training goes on to
succeed in its first attempt."""

from __future__ import annotations

import re
import time
from datetime import datetime

import pytest

from apps.jobs.models import Job, JobState
from tests.conftest import api_client

from .live import fast_trainer, wait_for
from .test_faults import submit

pytestmark = [pytest.mark.integration, pytest.mark.one_database, pytest.mark.django_db(transaction=True)]
OUTAGE_S = 35  # past RQ's job_monitoring_interval: the slot running the job heartbeats into the outage
SLOTS = 2
BACK_WITHIN_S = 8  # each process retries every 2 s (apps.core.redis_outage.RETRY_S); slack for a loaded machine
DOWN, BACK = "Redis unreachable at", "Redis reachable again at"


def redis_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if re.search(r"redis|connection", line, re.IGNORECASE)]


def all_back(logs: dict[str, str]) -> bool:
    """Every process that said Redis was unreachable has said it is back."""
    return all(log.count(BACK) >= log.count(DOWN) >= 1 for log in logs.values())


def logged_at(line: str) -> datetime:
    """The plain log format's time (local, like the test's)."""
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")


def test_a_redis_outage_is_one_warning_per_process_and_the_training_goes_on(live, alice, redis_server):
    live.start_scheduler()
    live.start("worker", "gpu_worker", "--name", "node-a", "--simulate-gpus", "1", "--slots", str(SLOTS),
               **fast_trainer(1.0))
    live.start("notify", "notify_worker")
    job_id = submit(api_client(alice), epochs=60, name="redis-outage")
    wait_for(lambda: Job.objects.get(pk=job_id).epochs_done >= 2, 120, what="the job to train")
    redis_server.kill()
    time.sleep(OUTAGE_S)
    redis_server.start()
    restarted = datetime.fromtimestamp(time.time())  # answering PING: start() waits for it

    def logs() -> dict[str, str]:
        return {name: live.log(name) for name in ("worker", "notify", "scheduler")}

    wait_for(lambda: all_back(logs()), 60, what="every process's line that Redis is back",
             detail=lambda: "\n".join(f"{name}: {redis_lines(log)}" for name, log in logs().items()))
    # Soon, not at a busy slot's next job-monitoring heartbeat (up to 30 s later) nor never (the scheduler).
    late = {name: [line for line in log.splitlines()
                   if BACK in line and (logged_at(line) - restarted).total_seconds() > BACK_WITHIN_S]
            for name, log in logs().items()}
    assert not any(late.values()), f"restarted at {restarted}, back lines later than {BACK_WITHIN_S} s: {late}"
    assert Job.objects.get(pk=job_id).state == JobState.RUNNING, "the outage must not end the training"
    wait_for(lambda: Job.objects.get(pk=job_id).state in {JobState.SUCCEEDED, JobState.FAILED}, 180,
             what="the job to finish")
    final = Job.objects.get(pk=job_id)
    assert final.state == JobState.SUCCEEDED, final.error
    assert final.attempt == 1
    worker, notify = live.log("worker"), live.log("notify")
    for name, log in (("worker", worker), ("notify", notify)):
        for noise in ("quitting", "Traceback", "raised an exception", "HorseMonitorTimeoutException", "ERROR"):
            assert noise not in log, f"{name} log has {noise!r}:\n{log[-4000:]}"
    # One line down and one line back per process: the slots and the worker's main process.
    assert worker.count("Redis unreachable at") <= SLOTS + 1, worker[-4000:]
    assert len(redis_lines(worker)) <= 2 * (SLOTS + 1), "\n".join(redis_lines(worker))
    assert len(redis_lines(notify)) <= 4, "\n".join(redis_lines(notify))
    # The scheduler: its one WARNING of the outage says what it does meanwhile (not "Redis
    # unavailable" every round), one line when it is back, then it leads again (the lease lapsed).
    scheduler = live.log("scheduler")
    assert "Traceback" not in scheduler, scheduler[-4000:]
    alarms = [line for line in scheduler.splitlines() if re.search(r" (WARNING|ERROR|CRITICAL) ", line)]
    assert len(alarms) == 1 and DOWN in alarms[0], "\n".join(alarms[:10])
    assert "plans nothing meanwhile" in alarms[0] and "leader lease" in alarms[0], alarms[0]
    assert scheduler.count(BACK) == 1, "\n".join(redis_lines(scheduler))
    assert "leads with fencing token" in scheduler.split(BACK, 1)[1], scheduler[-4000:]
