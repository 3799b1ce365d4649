"""Two schedulers against one PostgreSQL: the leader dies mid-pass, twice, under 500 jobs.

Several workers run the jobs with the fast trainer (worker/fast_child.py: the real event
contract, real checkpoint files, no Ultralytics), so hundreds of attempts go through the
real scheduler, RQ, work-horses and monitors in minutes. The invariant watcher samples the
database throughout: no GPU slot held by two attempts (or by an attempt that ended), every
running attempt holding exactly its slots, no job training in two processes.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from django.conf import settings as django_settings

from apps.core.redis_client import redis_client
from apps.jobs.models import TERMINAL_STATES, GpuSlot, Job, JobEvent, JobState, MetricPoint
from apps.jobs.services import job_submit
from apps.jobs.spec import parse_spec
from apps.scheduling.leader import LEASE_KEY

from .live import InvariantWatch, fast_trainer, open_jobs, wait_for

pytestmark = [
    pytest.mark.faults, pytest.mark.integration, pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not django_settings.DATABASES["default"]["ENGINE"].endswith("postgresql"),
                       reason="two schedulers against one PostgreSQL: runs in `make test-postgres`"),
]
SHARES = (1, 0.5, 0.25, 0.125, 1, 2)
TOTAL = int(os.environ.get("STRESS_JOBS", "500"))
# Each wait's own deadline (s). Whichever runs out fails with its own message (the last one says
# how many jobs were still open, and which): the pytest timeout is their sum plus SLACK_S for
# what is not a wait (submitting TOTAL jobs, the fixtures, the checks at the end), not the
# suite's 600 s, which the waits for 500 jobs alone exceed.
WAITS_S = {"nodes": 120, "first leads": 60, "first dies": 120, "second leads": 60, "second dies": 300,
           "a new leader": 60, "every job": 60 + 2 * TOTAL}
SLACK_S = 300


def leader_pid() -> int | None:
    raw = redis_client().get(LEASE_KEY)
    return int(raw.decode().split("#")[0].rsplit(":", 1)[1]) if raw else None


def exit_code(process, timeout: float) -> int | str:
    """The process's exit code, or what it was doing when ``timeout`` ran out (it still runs)."""
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        return f"still running after {timeout:.0f} s"


def submit_many(user, count: int) -> list[str]:
    ids = []
    for n in range(count):
        spec = parse_spec({"task_name": f"stress-{n}", "team": "vision", "allow_duplicate": True,
                           "command": "yolo train data=demo model=yolov8n.yaml epochs=2 imgsz=64",
                           "resources": {"gpu": SHARES[n % len(SHARES)]}, "priority": "low", "timeout": 3600})
        job, _ = job_submit(user=user, spec=spec)
        ids.append(str(job.pk))
    return ids


@pytest.mark.timeout(sum(WAITS_S.values()) + SLACK_S)
def test_the_leader_dies_mid_pass_twice_and_no_gpu_slot_is_ever_held_twice(live, alice, teams, settings):
    settings.MAX_ACTIVE_JOBS_PER_USER = 10_000
    total = TOTAL
    for node in ("node-a", "node-b", "node-c"):
        live.start_worker(f"worker-{node}", node=node, gpus=2, **fast_trainer(0.05))
    from apps.cluster.models import Node

    wait_for(lambda: Node.objects.count() == 3, WAITS_S["nodes"], what="three nodes to register")
    accepted = submit_many(alice, total)

    with InvariantWatch() as watch:
        # Each leader dies inside its claim transaction (fault injection: os._exit after a
        # first claim, before commit): the first on its first pass, the second on its tenth,
        # with jobs running and finishing on every node. A standby waits on the lease.
        first = live.start_scheduler("scheduler-a", YOLOPORTAL_FAULT="mid_claim")
        wait_for(lambda: leader_pid() == first.pid, WAITS_S["first leads"], what="scheduler-a to lead")
        second = live.start_scheduler("scheduler-b", YOLOPORTAL_FAULT="mid_claim@10")
        assert exit_code(first, WAITS_S["first dies"]) == 17, live.log("scheduler-a")[-3000:]
        wait_for(lambda: leader_pid() == second.pid, WAITS_S["second leads"], what="scheduler-b to take over")
        assert exit_code(second, WAITS_S["second dies"]) == 17, live.log("scheduler-b")[-3000:]
        died_at = time.monotonic()
        assert JobEvent.objects.filter(kind="succeeded").exists(), "the second leader died mid-run"
        # Two fresh schedulers: one takes over when the dead leader's lease runs out.
        third, fourth = live.start_scheduler("scheduler-c"), live.start_scheduler("scheduler-d")
        wait_for(lambda: leader_pid() in (third.pid, fourth.pid), WAITS_S["a new leader"], what="a new leader")
        takeover_s = time.monotonic() - died_at
        wait_for(lambda: Job.objects.filter(pk__in=accepted, state__in=TERMINAL_STATES).count() == total,
                 timeout=WAITS_S["every job"], interval=1.0, what="every job to finish",
                 detail=lambda: open_jobs(accepted))

    assert watch.samples > 50 and not watch.violations, watch.violations[:10]
    assert "fault injection: exiting at mid_claim" in live.log("scheduler-a")
    assert "fault injection: exiting at mid_claim (time 10)" in live.log("scheduler-b")
    states = set(Job.objects.filter(pk__in=accepted).values_list("state", flat=True))
    assert states == {JobState.SUCCEEDED}, states
    assert JobEvent.objects.filter(job_id__in=accepted, kind="succeeded").count() == total, "each finishes once"
    assert MetricPoint.objects.filter(job_id__in=accepted).count() == 2 * total, "each epoch recorded once"
    assert not GpuSlot.objects.exists(), "every slot was freed with its attempt"
    print(f"{total} jobs; leader killed mid-claim twice; new leader {takeover_s:.1f} s after the second death; "
          f"{watch.samples} invariant samples")
