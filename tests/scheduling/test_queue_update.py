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
