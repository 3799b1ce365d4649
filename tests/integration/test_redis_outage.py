"""A Redis outage longer than RQ's job-monitoring interval (30 s) while a node trains (trial M12):
the worker and notify_worker logs say so in a line per process and that it is back, with no
RQ "quitting" or traceback, and the training goes on to succeed in its first attempt."""

from __future__ import annotations

import re
import time

import pytest

from apps.jobs.models import Job, JobState
from tests.conftest import api_client

from .live import fast_trainer, wait_for
from .test_faults import submit

pytestmark = [pytest.mark.integration, pytest.mark.one_database, pytest.mark.django_db(transaction=True)]
OUTAGE_S = 35  # past RQ's job_monitoring_interval: the slot running the job heartbeats into the outage
SLOTS = 2


def redis_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if re.search(r"redis|connection", line, re.IGNORECASE)]


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
    wait_for(lambda: "Redis reachable again" in live.log("worker"), 60, what="the worker's line that Redis is back")
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
