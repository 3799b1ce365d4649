"""A job never runs past its timeout (the worker stops it: timed out), so no runtime the
planner assumes or draws for it does either: a running job ends by ``started_at`` + its
timeout less its earlier attempts' runtime, a queued job's run is at most that budget."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.jobs.models import Job, JobState, MetricPoint
from apps.quotas.models import UsageRecord
from apps.scheduling.inputs import cluster_state
from apps.scheduling.policy import plan
from apps.scheduling.policy.eta import ArrivalStream

from .policy_helpers import HOUR, NOW, fair, job, node, running, state
from .test_runtime_overhead import datasets, ledger, submit  # noqa: F401 - the fixture is used by name

# --- the policy (pure) ---------------------------------------------------------------------


def test_a_queued_jobs_walltime_is_at_most_what_its_timeout_leaves_after_earlier_attempts() -> None:
    """Requeued after 1.5 h of a 2 h timeout: an estimated hour left is assumed to be the half
    hour the worker allows (it used to be capped at the whole timeout only)."""
    requeued = job("r", walltime_s=HOUR, timeout_s=2 * HOUR, attained_s=1.5 * HOUR)
    assert requeued.walltime == 0.5 * HOUR
    assert requeued.limit == 0.5 * HOUR
    assert requeued.with_walltime(3 * HOUR).walltime == 0.5 * HOUR
    assert job("new", walltime_s=3 * HOUR, timeout_s=2 * HOUR).walltime == 2 * HOUR


def test_no_scenario_draws_a_running_job_past_its_timeout() -> None:
    """The only GPU's job times out in an hour at the latest: the job next in line starts by
    then in every scenario (its runtime error, lognormal, drew ends up to ~2× later)."""
    busy = [running("r", "n1", (0,), left_s=HOUR, ends_by=NOW + HOUR)]
    result = plan(state([node("n1", gpus=1)], [job("q")], busy), NOW)
    (entry,) = result.queue
    assert entry.estimated_start_high <= NOW + HOUR
    unbounded = plan(state([node("n1", gpus=1)], [job("q")], [running("r", "n1", (0,), left_s=HOUR)]), NOW)
    assert unbounded.queue[0].estimated_start_high > NOW + HOUR  # the draws would pass it


def test_no_scenario_draws_a_queued_job_longer_than_its_timeout() -> None:
    """First in line, estimated at 2 h with a 1 h timeout, behind a job due now: the job behind
    it starts within the hour in every scenario."""
    busy = [running("r", "n1", (0,), left_s=0.0)]
    queue = [job("first", walltime_s=2 * HOUR, timeout_s=HOUR, cls="high"), job("second", cls="low")]
    result = plan(state([node("n1", gpus=1)], queue, busy), NOW)
    second = next(e for e in result.queue if e.job_id == "second")
    assert second.estimated_start_high <= NOW + HOUR


def test_a_job_started_in_the_pass_ends_by_its_timeout_in_every_scenario() -> None:
    """The planner starts a 1 h-timeout job on the idle GPU: the job behind it is expected by
    the hour's end at the latest."""
    queue = [job("first", walltime_s=HOUR, timeout_s=HOUR, cls="high"), job("second", cls="low")]
    result = plan(state([node("n1", gpus=1)], queue), NOW)
    assert [s.job_id for s in result.starts] == ["first"]
    (second,) = result.queue
    assert second.estimated_start_high <= NOW + HOUR


def test_below_the_head_the_point_counts_a_requeued_jobs_budget_not_its_estimate() -> None:
    """With the forward simulation off (the coarse sweep alone), the job behind a requeued one
    that the timeout leaves half an hour is expected half an hour after the GPU frees."""
    busy = [running("r", "n1", (0,), left_s=0.5 * HOUR, ends_by=NOW + 0.5 * HOUR)]
    queue = [job("requeued", walltime_s=HOUR, timeout_s=2 * HOUR, attained_s=1.5 * HOUR, cls="high"),
             job("second", cls="low")]
    result = plan(state([node("n1", gpus=1)], queue, busy, config=fair(eta_scenarios=0)), NOW)
    second = next(e for e in result.queue if e.job_id == "second")
    assert second.estimated_start == pytest.approx(NOW + HOUR, abs=1.0)


def test_sampled_arrivals_run_at_most_their_timeout() -> None:
    """Inflow copies of a recent arrival whose estimate exceeds its timeout: the copies' drawn
    runtimes stay within the timeout (the job of interest ranks below them all)."""
    sample = job("recent", walltime_s=10 * HOUR, timeout_s=HOUR, cls="urgent")
    stream = ArrivalStream(random.Random(1), [sample], [1e9], 1.0, [0.0], -1.0, 2.0, NOW, NOW + 1e6, 50)
    drawn = []
    while stream.next_t0 < float("inf"):
        drawn.append(stream.pop())
    assert len(drawn) == 50 and max(p.walltime for p in drawn) <= HOUR
    assert {p.job.limit for p in drawn} == {HOUR}


# --- the live inputs (the database) ----------------------------------------------------------


def run_on(job_obj, node_obj, *, started, epochs_done=0, attempt=1) -> None:
    Job.objects.filter(pk=job_obj.pk).update(state=JobState.RUNNING, node=node_obj, gpu_indices=[0],
                                             started_at=started, epochs_done=epochs_done, attempt=attempt)


@pytest.mark.django_db
def test_a_slow_running_job_near_its_timeout_ends_by_it_not_at_its_epoch_rate(alice, datasets, node):  # noqa: F811
    """Two epochs ~100 min apart, 38 to go, 200 s of its 2 h timeout left: it ends in 200 s
    (its epoch rate said ~63 h), and a job queued behind it is expected by then."""
    from worker.inventory import simulated_gpus
    from worker.node import register_this_host

    one = register_this_host(name="one-gpu", gpus=simulated_gpus(1))
    node.delete()
    ledger(alice)
    slow = submit(alice, epochs=40)  # timeout 7200 s
    now = timezone.now()
    started = now - timedelta(seconds=7000)
    run_on(slow, one, started=started, epochs_done=2)
    for epoch, at in ((1, 900.0), (2, 6900.0)):
        point = MetricPoint.objects.create(job=slow, epoch=epoch, attempt=1, seq=epoch, values={})
        MetricPoint.objects.filter(pk=point.pk).update(created_at=started + timedelta(seconds=at))
    behind = submit(alice, epochs=40)
    state_, _ = cluster_state(now)
    (alloc,) = state_.running
    deadline = (started + timedelta(seconds=7200)).timestamp()
    assert alloc.expected_end == pytest.approx(deadline, abs=0.01)
    assert alloc.ends_by == pytest.approx(deadline, abs=0.01)
    (entry,) = plan(state_, now.timestamp()).queue
    assert entry.job_id == str(behind.pk)
    assert entry.estimated_start_high <= deadline + 1e-6


@pytest.mark.django_db
def test_a_requeued_running_job_ends_by_what_its_earlier_attempt_left_of_the_timeout(alice, datasets, node):  # noqa: F811
    """Its first attempt ran 5,000 s of a 7,200 s timeout: the second, started 1,000 s ago with
    no estimate (the stated hour), ends by 2,200 s after its start, not an hour after."""
    requeued = submit(alice, epochs=40)
    UsageRecord.objects.create(job=requeued, team=requeued.team, user=requeued.user, attempt=1,
                               priority_class="medium", gpu_seconds=5000.0,
                               started_at=timezone.now() - timedelta(hours=3),
                               ended_at=timezone.now() - timedelta(hours=3) + timedelta(seconds=5000))
    now = timezone.now()
    started = now - timedelta(seconds=1000)
    run_on(requeued, node, started=started, attempt=2)
    state_, _ = cluster_state(now)
    (alloc,) = state_.running
    assert alloc.expected_end == pytest.approx((started + timedelta(seconds=2200)).timestamp(), abs=0.01)
    assert alloc.ends_by == alloc.expected_end


@pytest.mark.django_db
def test_a_queued_requeued_job_is_assumed_to_run_at_most_what_its_timeout_leaves(alice, datasets, node):  # noqa: F811
    """Requeued after 5,000 s of a 7,200 s timeout, with no estimate (the stated hour): the
    planner assumes 2,200 s."""
    requeued = submit(alice, epochs=40)
    Job.objects.filter(pk=requeued.pk).update(attempt=2)
    UsageRecord.objects.create(job=requeued, team=requeued.team, user=requeued.user, attempt=1,
                               priority_class="medium", gpu_seconds=5000.0,
                               started_at=timezone.now() - timedelta(hours=3),
                               ended_at=timezone.now() - timedelta(hours=3) + timedelta(seconds=5000))
    state_, _ = cluster_state()
    (request,) = state_.queued
    assert request.walltime == pytest.approx(2200.0, abs=0.01)
