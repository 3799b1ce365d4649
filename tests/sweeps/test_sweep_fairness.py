"""A sweep's trials are ordinary jobs to the policy: on a busy cluster they interleave with another
user's jobs, and that user waits no longer than against the same number of single jobs.

A small event loop around the pure policy (``plan`` on a ClusterState, as the live scheduler and
the simulator call it), with the sweep step's own rule for releasing trials
(``apps.sweeps.search.trials_to_create``): each time something ends, the sweep submits trials
until ``parallel`` are queued or running. The simulator replays fixed traces; a sweep's arrivals
depend on its own completions, hence this loop.
"""

from __future__ import annotations

import heapq
import statistics

import pytest

from apps.scheduling.policy import Allocation, ClusterState, DecayedUsage, JobRequest, plan
from apps.sweeps.search import trials_to_create
from tests.scheduling.policy_helpers import fair, node

HOUR = 3600.0
T0 = 1_800_000_000.0


def simulate(*, sweep_trials: int, parallel: int, other_jobs: int, other_at: float = 300.0,
             gpus: int = 4) -> dict:
    """sam (team vision) sweeps ``sweep_trials`` 1-GPU trials of an hour, ``parallel`` at once;
    olga (team robotics) submits ``other_jobs`` 1-GPU jobs of an hour ``other_at`` seconds later."""
    config = fair()
    nodes = (node("node-a", gpus=gpus),)
    usage = DecayedUsage(config.half_life_s)
    queued: dict[str, JobRequest] = {}
    running: dict[str, Allocation] = {}
    ends: list[tuple[float, str]] = []
    started: dict[str, float] = {}
    submitted: dict[str, float] = {}
    created = 0
    sweep_active_most = 0
    order: list[str] = []

    def submit(job_id: str, team: str, user: str, at: float) -> None:
        queued[job_id] = JobRequest(job_id, team, user, at, gpus=1.0, walltime_s=HOUR, timeout_s=2 * HOUR)
        submitted[job_id] = at

    def sweep_step(at: float) -> None:
        nonlocal created, sweep_active_most
        active = sum(1 for j in [*queued, *running] if j.startswith("trial-"))
        for _ in range(trials_to_create(created=created, active=active, trials=sweep_trials, parallel=parallel)):
            submit(f"trial-{created:02d}", "vision", "sam", at)
            created += 1
        active = sum(1 for j in [*queued, *running] if j.startswith("trial-"))
        sweep_active_most = max(sweep_active_most, active)

    events = [T0, T0 + other_at]
    now = T0
    last = T0
    while events or ends or queued:
        now = min([*events, *(e for e, _ in ends)]) if (events or ends) else now
        for alloc in running.values():  # usage accrues as the policy's inputs say it does
            usage.add((alloc.team, alloc.user), alloc.gpus * (now - last), at=now)
        last = now
        while ends and ends[0][0] <= now:
            _, job_id = heapq.heappop(ends)
            running.pop(job_id)
        if now in events:
            events = [e for e in events if e != now]
            if now == T0 + other_at:
                for n in range(other_jobs):
                    submit(f"olga-{n:02d}", "robotics", "olga", now)
        sweep_step(now)
        state = ClusterState(nodes=nodes, running=tuple(running.values()), queued=tuple(queued.values()),
                             config=config, usage=usage.snapshot(now))
        result = plan(state, now)
        assert not result.preemptions
        for start in result.starts:
            request = queued.pop(start.job_id)
            running[start.job_id] = Allocation(start.job_id, request.team, request.user, start.node,
                                               start.gpu_indices, started_at=now, expected_end=now + HOUR)
            started[start.job_id] = now
            order.append(start.job_id)
            heapq.heappush(ends, (now + HOUR, start.job_id))
        if not ends and not events and queued:
            raise AssertionError(f"stuck with {sorted(queued)} queued")
    waits = {j: started[j] - submitted[j] for j in started}
    olga = [w for j, w in waits.items() if j.startswith("olga-")]
    return {"olga_mean_wait": statistics.mean(olga), "olga_max_wait": max(olga), "order": order,
            "sweep_active_most": sweep_active_most, "trials": created,
            "sam_done_at": max(started[j] for j in started if j.startswith("trial-")) + HOUR - T0}


@pytest.mark.parametrize("parallel", [1, 2, 4, 8])
def test_the_other_user_waits_no_longer_than_against_as_many_single_jobs(parallel):
    sweep = simulate(sweep_trials=16, parallel=parallel, other_jobs=8)
    singles = simulate(sweep_trials=16, parallel=16, other_jobs=8)  # all 16 submitted at once: single jobs
    assert sweep["trials"] == singles["trials"] == 16
    assert sweep["sweep_active_most"] == parallel
    assert sweep["olga_mean_wait"] <= singles["olga_mean_wait"]
    assert sweep["olga_max_wait"] <= singles["olga_max_wait"]


def test_the_trials_interleave_with_the_other_users_jobs():
    """While both have work queued they split the GPUs: olga's jobs never wait behind more than one
    round (four GPUs) of trials, and of the first 16 starts each gets eight."""
    order = simulate(sweep_trials=16, parallel=4, other_jobs=8)["order"]
    assert sum(1 for j in order[:16] if j.startswith("olga-")) == 8
    since_olga = 0
    for job_id in order[4:16]:  # from the first start after olga arrived
        since_olga = 0 if job_id.startswith("olga-") else since_olga + 1
        assert since_olga <= 4, order


def test_a_sweep_that_may_run_all_its_trials_at_once_is_exactly_a_batch_of_single_jobs():
    """Nothing favours a sweep for being one: with parallel >= trials it is the same schedule."""
    as_sweep = simulate(sweep_trials=12, parallel=12, other_jobs=6)
    as_batch = simulate(sweep_trials=12, parallel=100, other_jobs=6)
    assert as_sweep["order"] == as_batch["order"]
    assert as_sweep["olga_mean_wait"] == as_batch["olga_mean_wait"]
