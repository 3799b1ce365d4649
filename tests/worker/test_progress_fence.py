"""Live progress is fenced cheaply (review23, 7): the child reports it up to 4 times a second,
and a read of the attempt fence for each doubled a training's statements. The work-horse keeps
its answer for a second of monotonic time (worker.tasks.AttemptRunner.may_record); the Slurm
report fenced the whole post already (jobs.services.attempt_report).
"""

from __future__ import annotations

import logging

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.cluster.models import Node
from apps.jobs import live
from apps.jobs.models import Job
from apps.jobs.services import attempt_lost, attempt_report, attempt_resume_choose, attempt_start, job_claim
from tests.jobs.factories import make_job
from worker import tasks
from worker.tasks import AttemptRunner, ChildResult

pytestmark = pytest.mark.django_db


@pytest.fixture
def running(alice, teams, node, settings, tmp_path):
    """Attempt 1 of a job, started on node-a GPU 0 (its run folder under tmp_path)."""
    settings.JOBS_DIR = tmp_path / "jobs"
    job = make_job(team=teams["vision"], user=alice, gpus=1, retries_left=1)
    assert job_claim(job, node=node, gpu_indices=[0], gpu_share=1.0, run_class="medium")
    return attempt_start(job_id=job.pk, attempt_id=Job.objects.get(pk=job.pk).attempt_id, node_name="node-a")


@pytest.fixture
def published(monkeypatch) -> list[dict]:
    """The live progress messages sent to the job's watchers."""
    sent: list[dict] = []
    monkeypatch.setattr(live, "publish", lambda job_id, message: sent.append(message) or True)
    return sent


def progress(batch: int) -> dict:
    return {"type": "progress", "epoch": 3, "batch": batch, "batches": 120}


def test_ten_progress_events_within_a_second_cost_at_most_one_read(running, published):
    runner = AttemptRunner(Job.objects.select_related("node").get(pk=running.pk))
    with CaptureQueriesContext(connection) as captured:
        for batch in range(10):
            runner.on_event(progress(batch), ChildResult())
    assert len(captured) <= 1, [q["sql"] for q in captured.captured_queries]
    assert len(published) == 10


def test_a_fenced_attempt_s_progress_is_refused_once_its_answer_is_a_second_old(running, published, caplog):
    runner = AttemptRunner(Job.objects.select_related("node").get(pk=running.pk))
    runner.on_event(progress(1), ChildResult())
    attempt_lost(Job.objects.get(pk=running.pk), reason="node-a silent for 9 s", now=timezone.now())
    new = Job.objects.get(pk=running.pk)
    assert job_claim(new, node=Node.objects.get(name="node-a"), gpu_indices=[0], gpu_share=1.0, run_class="medium")
    new = attempt_start(job_id=new.pk, attempt_id=Job.objects.get(pk=new.pk).attempt_id, node_name="node-a")
    assert attempt_resume_choose(new)
    taken, _ = runner.may_record_read
    runner.may_record_read = (taken - tasks.MAY_RECORD_CACHE_S, True)  # a second later (or woken from SIGSTOP)
    with caplog.at_level(logging.WARNING, logger="apps.jobs.services"):
        runner.on_event(progress(2), ChildResult())
    assert [m["data"]["batch"] for m in published] == [1]
    assert any("progress of attempt 1 refused" in r.getMessage() for r in caplog.records)


def test_a_slurm_report_s_progress_costs_no_read_per_event(running, published):
    """attempt_report fenced the whole post: a post of 10 progress events costs what one does."""

    def statements(events: list[dict]) -> int:
        job = Job.objects.select_related("node", "team", "user").get(pk=running.pk)  # as attempt_token_check reads it
        with CaptureQueriesContext(connection) as captured:
            assert attempt_report(job, attempt_id=job.attempt_id, events=events, log="", final=None) == ""
        return len(captured)

    assert statements([progress(b) for b in range(10)]) == statements([progress(0)])
    assert len(published) == 11
