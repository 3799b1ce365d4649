"""The live pass at queue scale: what it reads of queued jobs and how it writes their positions back."""

from __future__ import annotations

import gc
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.jobs.models import Job, JobState
from apps.jobs.services import QUEUE_INFO_CHUNK, job_queue_info_set
from apps.scheduling.loop import plan_and_start

from .test_inputs import submit

pytestmark = pytest.mark.django_db


def job_updates(queries) -> list[str]:
    """The statements that wrote jobs rows (an executemany is logged once, as "N times: UPDATE …")."""
    return [q["sql"] for q in queries.captured_queries if 'UPDATE "jobs_job"' in q["sql"]]


def test_one_arrival_ahead_rewrites_every_position_in_one_statement(alice, bob, demo_registered, node):
    """node-a has 2 GPUs: one 2-GPU job runs, twelve wait. A high-priority arrival moves every
    waiting job back one place: all twelve rows are written, as one statement, not twelve."""
    jobs = [submit(alice if k % 2 else bob, epochs=5 + k, resources={"gpu": 2}) for k in range(13)]
    plan_and_start()
    waiting = Job.objects.filter(state=JobState.QUEUED)
    before = {j.pk: j.queue_position for j in waiting}
    assert len(before) == 12 and sorted(before.values()) == list(range(1, 13))

    first = submit(alice, epochs=1, resources={"gpu": 2}, priority="high")
    with CaptureQueriesContext(connection) as queries:
        plan_and_start()
    assert gc.isenabled()  # the pass pauses the cyclic collector (policy.gc_paused) and restores it
    updates = job_updates(queries)
    assert len(updates) == 1 and updates[0].startswith("13 times: UPDATE"), updates
    after = {j.pk: j.queue_position for j in Job.objects.filter(state=JobState.QUEUED)}
    assert after.pop(first.pk) == 1
    assert after == {pk: position + 1 for pk, position in before.items()}
    assert len(jobs) == 13


def test_a_pass_reads_and_writes_with_queries_constant_in_the_queue_length(alice, bob, demo_registered, node):
    """A field of a queued job that the pass loads lazily, or a row written alone, would cost a
    query per queued job: the same pass over 4 and over 24 waiting jobs runs as many queries."""

    def pass_queries() -> int:
        submit(alice, epochs=1, resources={"gpu": 2}, priority="high")  # moves every waiting job
        with CaptureQueriesContext(connection) as queries:
            plan_and_start()
        return len(queries.captured_queries)

    submit(bob, epochs=50, resources={"gpu": 2})  # runs: the rest wait behind it
    for k in range(4):
        submit(bob, epochs=5 + k, resources={"gpu": 2})
    plan_and_start()
    small = pass_queries()
    for k in range(20):
        submit(alice if k % 2 else bob, epochs=10 + k, resources={"gpu": 2})
    plan_and_start()
    assert pass_queries() == small


def test_queue_info_is_written_only_to_queued_rows_as_the_orm_would_write_it(alice, demo_registered, node):
    waiting, started, third = (submit(alice, epochs=e) for e in (3, 4, 5))
    Job.objects.filter(pk=started.pk).update(state=JobState.RUNNING, reason="its own")
    at = datetime(2026, 12, 2, 9, 30, 15, 250000, tzinfo=UTC)
    values = {
        "queue_position": 7, "estimated_start_at": at, "estimated_start_low_at": at - timedelta(minutes=5),
        "estimated_start_high_at": None, "reason": "waiting for 1 GPU on one node; expected 09:30 UTC",
        "priority_score": 1234.567, "priority_factors": {"fairshare": 0.5, "age": 0.25, "size": 1.0, "class": 0.667},
        "predicted_start_at": at, "predicted_model_start_at": at + timedelta(seconds=1),
    }
    assert job_queue_info_set([(waiting.pk, values), (started.pk, values)]) == 1
    waiting.refresh_from_db()
    assert {name: getattr(waiting, name) for name in values} == values
    started.refresh_from_db()
    assert started.reason == "its own" and started.queue_position is None
    # More rows than a chunk: every one written (one transaction per chunk).
    many = [(third.pk, {**values, "queue_position": k}) for k in range(QUEUE_INFO_CHUNK + 3)]
    assert job_queue_info_set(many) == len(many)
    third.refresh_from_db()
    assert third.queue_position == QUEUE_INFO_CHUNK + 2
    assert job_queue_info_set([]) == 0


def test_an_eta_that_drifts_by_less_than_its_slack_is_not_rewritten_and_one_that_moves_is(alice, bob, demo_registered,
                                                                                          node):
    """A waiting job's stored ETA and reason stand while the new ETA is within ETA_SLACK_S or
    ETA_SLACK_FRACTION of the time still to wait (a far ETA drifting by minutes, a reason's clock
    rolling over a minute); a move beyond that is written, reason and all."""
    from dataclasses import replace

    from django.utils import timezone

    from apps.scheduling import policy
    from apps.scheduling.inputs import cluster_state
    from apps.scheduling.loop import ETA_SLACK_FRACTION, queue_update

    submit(bob, epochs=50, resources={"gpu": 2})
    waiting = [submit(alice if k % 2 else bob, epochs=5 + k, resources={"gpu": 2}) for k in range(6)]
    now = timezone.now()
    plan_and_start(now)
    state, jobs_by_id = cluster_state(now)
    entries = policy.plan(state, now.timestamp()).queue
    assert queue_update(entries, jobs_by_id, now) == 0  # nothing changed
    last = entries[-1]
    stored = Job.objects.get(pk=last.job_id)
    wait_s = last.estimated_start - now.timestamp()
    assert wait_s > 3600 and stored.reason.endswith(" UTC")  # "…; expected 14:20 UTC": a clock time in it

    def moved(by_s: float) -> list:
        """Every waiting job as planned, the last one's ETA (range and the reason's clock) moved by ``by_s``."""
        at = last.estimated_start + by_s
        text = stored.reason.rsplit("expected ", 1)[0] + f"expected {time_text(at)}"
        return [*entries[:-1], replace(last, estimated_start=at, estimated_start_low=last.estimated_start_low + by_s,
                                       estimated_start_high=last.estimated_start_high + by_s, reason=text)]

    small = 0.5 * ETA_SLACK_FRACTION * wait_s  # minutes: more than the fixed 30 s, and the clock moves
    assert small > 120 and time_text(last.estimated_start + small) != time_text(last.estimated_start)
    assert queue_update(moved(small), jobs_by_id, now) == 0
    assert Job.objects.get(pk=last.job_id).estimated_start_at == stored.estimated_start_at

    large = 2 * ETA_SLACK_FRACTION * wait_s
    assert queue_update(moved(large), jobs_by_id, now) == 1
    written = Job.objects.get(pk=last.job_id)
    assert written.estimated_start_at.timestamp() == pytest.approx(last.estimated_start + large, abs=1e-3)
    assert written.reason.endswith(time_text(last.estimated_start + large)) and written.reason != stored.reason
    assert len(waiting) == 6


def time_text(t: float) -> str:
    from apps.scheduling.policy.explain import fmt_time

    return fmt_time(t, t - 60)
