"""What an attempt reports after it was taken away (jobs.services.attempt_may_record).

A worker that was stopped (SIGSTOP, a partition) and wakes up, or a preempted child finishing
its epoch, reports metrics, checkpoints and output for its attempt before its next check-in
notices the fence. Once a later attempt has chosen the checkpoint it resumes from, those rows
are refused: a job's metrics, checkpoints and log are its current attempt's (chaos21 leftover).
Until then they are kept: graceful preemption records the victim's epoch-end checkpoint after
the requeue, by design, and the next attempt may already be running, waiting for its GPUs or
for the victim to stop (review22, 4).
"""

from __future__ import annotations

import logging

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.cluster.models import Node
from apps.jobs.models import Checkpoint, Job, JobEvent, LogChunk, MetricPoint
from apps.jobs.services import (
    attempt_event_record,
    attempt_finish,
    attempt_lost,
    attempt_preempt,
    attempt_resume_choose,
    attempt_start,
    job_claim,
    log_append,
)

from .factories import make_job

pytestmark = pytest.mark.django_db


@pytest.fixture
def running(alice, teams, node, settings, tmp_path):
    """Attempt 1 of a job, started on node-a GPU 0 (its run folder under tmp_path)."""
    settings.JOBS_DIR = tmp_path / "jobs"
    job = make_job(team=teams["vision"], user=alice, gpus=1, retries_left=1)
    assert job_claim(job, node=node, gpu_indices=[0], gpu_share=1.0, run_class="medium")
    return attempt_start(job_id=job.pk, attempt_id=Job.objects.get(pk=job.pk).attempt_id, node_name="node-a")


def place_and_start(job_id) -> Job:
    """The scheduler places the requeued job again and a worker starts that attempt."""
    job = Job.objects.get(pk=job_id)
    assert job_claim(job, node=Node.objects.get(name="node-a"), gpu_indices=[0], gpu_share=1.0, run_class="medium")
    return attempt_start(job_id=job.pk, attempt_id=Job.objects.get(pk=job.pk).attempt_id, node_name="node-a")


def checkpoint_event(job: Job, epoch: int, content: bytes) -> dict:
    """What the child reports at an epoch's end (worker/train_child.copy_checkpoint), file written."""
    import hashlib

    path = job.run_dir / "checkpoints" / f"epoch-{epoch:04d}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return {"type": "checkpoint", "epoch": epoch, "path": str(path), "sha256": hashlib.sha256(content).hexdigest(),
            "size": len(content)}


def test_a_stale_attempt_s_rows_are_refused_once_a_later_attempt_has_chosen_its_checkpoint(running, caplog):
    old = running  # the woken worker's copy: attempt 1
    attempt_lost(Job.objects.get(pk=old.pk), reason="node-a silent for 9 s", now=timezone.now())
    new = place_and_start(old.pk)
    assert new.attempt == 2
    assert attempt_resume_choose(new)  # worker.tasks.AttemptRunner.resume_candidates
    attempt_event_record(new, {"type": "epoch", "epoch": 3, "values": {"loss": 0.2}})
    attempt_event_record(new, checkpoint_event(new, 3, b"attempt 2"))

    with caplog.at_level(logging.WARNING, logger="apps.jobs.services"):
        attempt_event_record(old, {"type": "epoch", "epoch": 3, "values": {"loss": 9.9}})
        attempt_event_record(old, {"type": "epoch", "epoch": 4, "values": {"loss": 9.9}})
        attempt_event_record(old, checkpoint_event(old, 4, b"attempt 1"))
        assert list(MetricPoint.objects.filter(job_id=old.pk).values_list("epoch", "attempt", "values")) == [
            (3, 2, {"loss": 0.2})]
        assert list(Checkpoint.objects.filter(job_id=old.pk).values_list("epoch", "attempt")) == [(3, 2)]
        assert log_append(old, "epoch 4/10 done\n", from_attempt=True) is None
    assert not LogChunk.objects.filter(job_id=old.pk).exists()
    assert Job.objects.get(pk=old.pk).epochs_done == 3
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refused) == 4 and all("of attempt 1 refused" in line for line in refused)
    # The current attempt still records.
    assert log_append(new, "epoch 4/10 done\n", from_attempt=True) is not None


def test_a_preempted_attempt_s_epoch_end_checkpoint_is_kept_while_the_job_waits_in_the_queue(running):
    victim = running
    assert attempt_preempt(Job.objects.get(pk=victim.pk), reason="an urgent job", now=timezone.now(), grace_s=30)
    # The victim's child finishes its epoch and reports it while the job waits in the queue.
    attempt_event_record(victim, {"type": "epoch", "epoch": 2, "values": {"loss": 0.5}})
    attempt_event_record(victim, checkpoint_event(victim, 2, b"epoch 2"))
    assert log_append(victim, "stopped after epoch 2\n", from_attempt=True) is not None
    assert list(Checkpoint.objects.filter(job_id=victim.pk).values_list("epoch", "attempt")) == [(2, 1)]
    assert MetricPoint.objects.filter(job_id=victim.pk, epoch=2, attempt=1).exists()
    # Also while the next attempt is only placed: its worker resumes from that checkpoint.
    job = Job.objects.get(pk=victim.pk)
    assert job_claim(job, node=Node.objects.get(name="node-a"), gpu_indices=[0], gpu_share=1.0, run_class="medium")
    attempt_event_record(victim, {"type": "epoch", "epoch": 3, "values": {"loss": 0.4}})
    assert MetricPoint.objects.filter(job_id=victim.pk, epoch=3, attempt=1).exists()


def test_a_preempted_attempt_s_epoch_end_is_kept_until_the_running_next_attempt_chooses_and_is_resumed_from(
        running, caplog):
    """review22, 4: the next attempt started (running) before the victim stopped: it waits for its
    GPUs, inputs, the victim's stop, and only then chooses, so the victim's epoch end still counts."""
    from worker.tasks import AttemptRunner

    victim = running
    assert attempt_preempt(Job.objects.get(pk=victim.pk), reason="an urgent job", now=timezone.now(), grace_s=30)
    new = place_and_start(victim.pk)
    assert new.attempt == 2 and new.state == "running"
    # The victim's child ends its epoch and stops there; its worker records that and ends.
    attempt_event_record(victim, {"type": "epoch", "epoch": 2, "values": {"loss": 0.5}})
    attempt_event_record(victim, checkpoint_event(victim, 2, b"epoch 2"))
    assert log_append(victim, "stopped after epoch 2\n", from_attempt=True) is not None
    assert attempt_finish(victim, outcome="fenced") == "fenced"
    assert list(Checkpoint.objects.filter(job_id=victim.pk).values_list("epoch", "attempt")) == [(2, 1)]

    candidates, stop = AttemptRunner(Job.objects.get(pk=new.pk)).resume_candidates()
    assert stop == "" and [c.epoch if c else None for c in candidates] == [2, None]
    # Chosen: a late report of the victim is the past now.
    with caplog.at_level(logging.WARNING, logger="apps.jobs.services"):
        attempt_event_record(victim, {"type": "epoch", "epoch": 3, "values": {"loss": 9.9}})
        attempt_event_record(victim, checkpoint_event(victim, 3, b"late"))
    assert not MetricPoint.objects.filter(job_id=victim.pk, epoch=3).exists()
    assert list(Checkpoint.objects.filter(job_id=victim.pk).values_list("epoch", flat=True)) == [2]


def test_a_preempted_attempt_s_epoch_end_is_kept_through_a_next_attempt_preempted_before_it_chose(running):
    """review23, 12: attempt 2 was preempted while it waited for attempt 1 (it chose nothing, trained
    nothing): attempt 1 may still record until attempt 3 chooses, not only while attempt 2 could."""
    victim = running
    assert attempt_resume_choose(victim)  # attempt 1 trained
    assert attempt_preempt(Job.objects.get(pk=victim.pk), reason="an urgent job", now=timezone.now(), grace_s=30)
    second = place_and_start(victim.pk)
    assert attempt_preempt(Job.objects.get(pk=second.pk), reason="a more urgent job", now=timezone.now(), grace_s=30)
    third = place_and_start(victim.pk)
    assert third.attempt == 3

    attempt_event_record(victim, {"type": "epoch", "epoch": 2, "values": {"loss": 0.5}})
    attempt_event_record(victim, checkpoint_event(victim, 2, b"epoch 2"))
    assert list(Checkpoint.objects.filter(job_id=victim.pk).values_list("epoch", "attempt")) == [(2, 1)]
    assert MetricPoint.objects.filter(job_id=victim.pk, epoch=2, attempt=1).exists()

    assert attempt_resume_choose(third)
    attempt_event_record(victim, {"type": "epoch", "epoch": 3, "values": {"loss": 9.9}})
    attempt_event_record(victim, checkpoint_event(victim, 3, b"late"))
    assert not MetricPoint.objects.filter(job_id=victim.pk, epoch=3).exists()
    assert list(Checkpoint.objects.filter(job_id=victim.pk).values_list("epoch", flat=True)) == [2]


def test_an_attempt_two_back_records_nothing_once_the_attempt_after_it_chose(running):
    """An attempt that chose and is then preempted is the one that may still record, not the one before it."""
    first = running
    attempt_lost(Job.objects.get(pk=first.pk), reason="node-a silent for 9 s", now=timezone.now())
    second = place_and_start(first.pk)
    assert attempt_resume_choose(second)
    assert attempt_preempt(Job.objects.get(pk=second.pk), reason="an urgent job", now=timezone.now(), grace_s=30)
    attempt_event_record(first, {"type": "epoch", "epoch": 2, "values": {"loss": 9.9}})
    attempt_event_record(second, {"type": "epoch", "epoch": 2, "values": {"loss": 0.5}})
    assert list(MetricPoint.objects.filter(job_id=first.pk).values_list("epoch", "attempt")) == [(2, 2)]


def test_a_stale_attempt_s_live_progress_and_mode_start_are_refused_once_the_next_attempt_has_chosen(
        running, caplog):
    """review22, 4: "epoch 3, batch 40/120" or "validating…" of a woken old attempt read as the job's now."""
    old = running
    attempt_lost(Job.objects.get(pk=old.pk), reason="node-a silent for 9 s", now=timezone.now())
    new = place_and_start(old.pk)
    assert attempt_resume_choose(new)
    with caplog.at_level(logging.WARNING, logger="apps.jobs.services"):
        attempt_event_record(old, {"type": "progress", "epoch": 3, "batch": 40, "batches": 120})
        attempt_event_record(old, {"type": "started", "mode": "val", "split": "val"})
    assert not JobEvent.objects.filter(job_id=old.pk, kind="val_started").exists()
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert [line.split(": ")[1].split(" of ")[0] for line in refused] == ["progress", "started"]
    attempt_event_record(new, {"type": "started", "mode": "val", "split": "val"})
    assert JobEvent.objects.filter(job_id=new.pk, kind="val_started", attempt=2).exists()


def test_a_stale_attempt_of_an_ended_job_records_nothing(running):
    stale = Job.objects.get(pk=running.pk)
    assert attempt_finish(running, outcome="cancelled") == "cancelled"
    attempt_event_record(stale, {"type": "epoch", "epoch": 1, "values": {"loss": 1.0}})
    assert not MetricPoint.objects.filter(job_id=stale.pk).exists()


def test_a_metric_costs_no_query_for_the_fence(running):
    """The fence is part of the seq update a point needs anyway: the statements it cost before
    the fence (seq update and read, the point's upsert, epochs_done), savepoints aside."""
    attempt_event_record(running, {"type": "epoch", "epoch": 1, "values": {"loss": 1.0}})
    with CaptureQueriesContext(connection) as captured:
        attempt_event_record(running, {"type": "epoch", "epoch": 2, "values": {"loss": 0.9}})
    statements = [q["sql"].split()[0] for q in captured.captured_queries
                  if not q["sql"].startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))]
    assert statements == ["UPDATE", "SELECT", "SELECT", "INSERT", "UPDATE"]


def test_a_superuser_s_job_form_cannot_write_back_a_stale_resume_chosen_attempt(running, superuser):
    """review24: ``resume_chosen_attempt`` is not among JobAdmin's readonly_fields, so a superuser's
    change form renders it as an input and its Save writes back the number it was rendered with.
    Rendered while attempt 1 ran, saved after attempt 2 chose: the fence reopens for attempt 1 (a
    woken worker's rows land on attempt 2's epochs). The old ``resume_chosen_at`` had the same hole.
    Failed before the lead fixed review24. Fix: add it to JobAdmin.readonly_fields (with the other system-written fields)."""
    from tests.conftest import admin_client

    page = admin_client(superuser).get(f"/admin/jobs/job/{running.pk}/change/")
    assert page.status_code == 200
    assert b'name="resume_chosen_attempt"' not in page.content
