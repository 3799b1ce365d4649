"""An attempt's life through jobs.services, the only writer of Job state: start, check-in,
checkpoints, outcome, loss and preemption. (The live versions run in tests/integration.)"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.cluster.models import Node
from apps.jobs.models import Checkpoint, GpuSlot, Job, JobEvent, JobState
from apps.jobs.services import (
    MAX_INFRA_REQUEUES,
    attempt_check_in,
    attempt_event_record,
    attempt_finish,
    attempt_lost,
    attempt_preempt,
    attempt_start,
    checkpoint_record,
    job_claim,
    job_requeue,
)
from apps.quotas.models import UsageRecord

from .factories import make_job

pytestmark = pytest.mark.django_db


@pytest.fixture
def starting(alice, teams, node):
    """A job the scheduler has placed on node-a GPU 0, not yet picked up by the worker."""
    job = make_job(team=teams["vision"], user=alice, gpus=1, retries_left=1)
    assert job_claim(job, node=node, gpu_indices=[0], gpu_share=1.0, run_class="medium")
    return Job.objects.get(pk=job.pk)


@pytest.fixture
def running(starting):
    return attempt_start(job_id=starting.pk, attempt_id=starting.attempt_id, node_name="node-a")


def kinds(job) -> list[str]:
    return list(JobEvent.objects.filter(job_id=job.pk).order_by("seq").values_list("kind", flat=True))


def test_the_current_attempt_starts_on_its_node(starting):
    job = attempt_start(job_id=starting.pk, attempt_id=starting.attempt_id, node_name="node-a")
    assert job.state == JobState.RUNNING and job.started_at and job.first_started_at and job.heartbeat_at
    assert kinds(job)[-1] == "running"


def test_a_stale_attempt_or_another_node_is_refused(starting):
    assert attempt_start(job_id=starting.pk, attempt_id=uuid.uuid4(), node_name="node-a") is None
    assert attempt_start(job_id=starting.pk, attempt_id=starting.attempt_id, node_name="node-b") is None
    assert Job.objects.get(pk=starting.pk).state == JobState.STARTING


def test_a_second_delivery_of_the_same_attempt_is_refused(running):
    assert attempt_start(job_id=running.pk, attempt_id=running.attempt_id, node_name="node-a") is None


def test_check_in_says_go_on_then_cancelled_then_fenced(running):
    assert attempt_check_in(running) == ""
    Job.objects.filter(pk=running.pk).update(cancel_requested_at=timezone.now())
    assert attempt_check_in(running) == "cancelled"
    job_requeue(Job.objects.get(pk=running.pk), reason="test")
    assert attempt_check_in(running) == "fenced"


def test_a_checkpoint_is_keyed_by_epoch_and_pruned_rows_go(running, tmp_path):
    first, second = tmp_path / "epoch-0001.pt", tmp_path / "epoch-0002.pt"
    first.write_bytes(b"1")
    checkpoint_record(running, epoch=1, path=str(first), sha256="a" * 64, size=1)
    checkpoint_record(running, epoch=1, path=str(first), sha256="b" * 64, size=1)
    assert Checkpoint.objects.get(job=running, epoch=1).sha256 == "b" * 64
    first.unlink()
    second.write_bytes(b"2")
    checkpoint_record(running, epoch=2, path=str(second), sha256="c" * 64, size=1)
    assert list(Checkpoint.objects.filter(job=running).values_list("epoch", flat=True)) == [2]


def test_success_is_final_charged_and_registered(running, settings, tmp_path):
    settings.JOBS_DIR = tmp_path / "jobs"
    weights = settings.JOBS_DIR / str(running.pk) / "train" / "weights" / "best.pt"
    weights.parent.mkdir(parents=True)
    weights.write_bytes(b"weights")
    finished = {"mode": "train", "weights": str(weights), "metrics": {"fitness": 0.5}}
    assert attempt_finish(running, outcome="succeeded", exit_code=0, finished=finished) == "succeeded"
    job = Job.objects.get(pk=running.pk)
    # Rows hold artifact keys, never absolute paths.
    assert job.state == JobState.SUCCEEDED and job.exit_code == 0
    assert job.weights_path == f"jobs/{running.pk}/train/weights/best.pt"
    assert job.model_version.metrics == {"fitness": 0.5}
    assert UsageRecord.objects.filter(job=job, attempt=job.attempt).count() == 1
    assert kinds(job)[-1] == "succeeded"


@pytest.mark.parametrize("outcome, state", [("cancelled", JobState.CANCELLED), ("timed_out", JobState.TIMED_OUT)])
def test_cancel_and_timeout_are_final(running, outcome, state):
    assert attempt_finish(running, outcome=outcome, exit_code=-15) == outcome
    job = Job.objects.get(pk=running.pk)
    assert job.state == state and job.finished_at and kinds(job)[-1] == outcome



@pytest.mark.parametrize("outcome, retries_left", [("cancelled", 1), ("timed_out", 1), ("failed", 0)])
def test_a_final_state_is_one_write_with_its_usage_and_event(running, outcome, retries_left, monkeypatch):
    """Cancelled, timed out or failed for good: the state, the GPU time charged and the event are
    one transaction, as a success is. A fault while charging (the process dies, the database
    refuses) leaves the job as it was, for the reaper, never ended without its usage."""
    import apps.jobs.services as services

    Job.objects.filter(pk=running.pk).update(retries_left=retries_left)
    running.refresh_from_db()

    def broken(job, *, ended_at):
        raise RuntimeError("the database went away")

    with monkeypatch.context() as patch:
        patch.setattr(services, "usage_charge", broken)
        with pytest.raises(RuntimeError):
            attempt_finish(running, outcome=outcome, exit_code=1, error="training error: boom")
    job = Job.objects.get(pk=running.pk)
    assert job.state == JobState.RUNNING and not UsageRecord.objects.filter(job=job).exists()
    assert outcome not in kinds(job)
    assert attempt_finish(running, outcome=outcome, exit_code=1, error="training error: boom") == outcome
    job = Job.objects.get(pk=running.pk)
    assert job.state == outcome and UsageRecord.objects.filter(job=job, attempt=job.attempt).count() == 1
    assert kinds(job)[-1] == outcome

def test_a_killed_training_is_requeued_without_spending_a_retry(running):
    assert attempt_finish(running, outcome="killed", exit_code=-9, error="killed") == "requeued"
    job = Job.objects.get(pk=running.pk)
    assert (job.state, job.attempt, job.retries_left) == (JobState.QUEUED, 2, 1)
    assert kinds(job)[-1] == "requeued"


def test_killed_past_the_infrastructure_budget_spends_retries(running):
    Job.objects.filter(pk=running.pk).update(attempt=2 + MAX_INFRA_REQUEUES)
    running.refresh_from_db()
    assert attempt_finish(running, outcome="killed", exit_code=-9, error="training process was killed") == "retry"
    assert Job.objects.get(pk=running.pk).retries_left == 0


def test_a_failure_spends_one_retry_then_fails(running):
    assert attempt_finish(running, outcome="failed", exit_code=1, error="training error: boom\nlog") == "retry"
    job = Job.objects.get(pk=running.pk)
    assert (job.state, job.attempt, job.retries_left) == (JobState.QUEUED, 2, 0)
    assert kinds(job)[-1] == "retry"
    job_claim(job, node=running.node, gpu_indices=[0], gpu_share=1.0, run_class="medium")
    second = attempt_start(job_id=job.pk, attempt_id=Job.objects.get(pk=job.pk).attempt_id, node_name="node-a")
    assert attempt_finish(second, outcome="failed", exit_code=1, error="training error: boom\nlog") == "failed"
    job = Job.objects.get(pk=running.pk)
    assert job.state == JobState.FAILED and job.error.startswith("training error: boom")
    assert UsageRecord.objects.filter(job=job).count() == 2


def test_a_retry_is_spent_only_with_its_requeue(running):
    """The decrement is part of the requeue's conditional update: a fenced attempt spends nothing."""
    stale = Job.objects.get(pk=running.pk)
    job_requeue(Job.objects.get(pk=running.pk), reason="preempted elsewhere")
    assert attempt_finish(stale, outcome="failed", exit_code=1, error="boom") == "fenced"
    job = Job.objects.get(pk=running.pk)
    assert (job.retries_left, job.state) == (1, JobState.QUEUED)
    assert kinds(job)[-1] == "attempt_stopped"


def test_a_retry_is_not_spent_below_zero(running):
    """If the retries are gone meanwhile (a manager edit), the failure is final instead."""
    Job.objects.filter(pk=running.pk).update(retries_left=0)
    assert attempt_finish(running, outcome="failed", exit_code=1, error="boom") == "failed"
    assert Job.objects.get(pk=running.pk).retries_left == 0


def test_terminal_colour_codes_of_a_failure_are_not_stored(running):
    """Ultralytics colours its messages; the error, the retry reason and the events keep the words only."""
    ultralytics = ("\x1b[31m\x1b[1mERROR\x1b[0m ❌ segment dataset incorrectly formatted or not a segment dataset.\n"
                   "\x1b[34m\x1b[1mtrain: \x1b[0mScanning labels... 4 images")
    assert attempt_finish(running, outcome="failed", exit_code=1, error=f"training error: {ultralytics}") == "retry"
    job = Job.objects.get(pk=running.pk)
    job_claim(job, node=running.node, gpu_indices=[0], gpu_share=1.0, run_class="medium")
    second = attempt_start(job_id=job.pk, attempt_id=Job.objects.get(pk=job.pk).attempt_id, node_name="node-a")
    assert attempt_finish(second, outcome="failed", exit_code=1, error=f"training error: {ultralytics}") == "failed"
    job = Job.objects.get(pk=running.pk)
    assert job.error == ("training error: ERROR ❌ segment dataset incorrectly formatted or not a segment dataset.\n"
                         "train: Scanning labels... 4 images")
    messages = list(JobEvent.objects.filter(job_id=job.pk, kind__in=["retry", "failed"]).values_list("message", flat=True))
    assert len(messages) == 2 and not any("\x1b" in message for message in messages)


def test_a_lost_attempt_is_requeued_as_a_new_attempt(running):
    now = timezone.now() + timedelta(seconds=5)
    attempt_lost(running, reason="node node-a stopped reporting for 9 s", now=now)
    job = Job.objects.get(pk=running.pk)
    assert (job.state, job.attempt, job.retries_left) == (JobState.QUEUED, 2, 1)
    assert kinds(job)[-1] == "node_lost"
    assert UsageRecord.objects.get(job=job, attempt=1).ended_at == now


def lose_and_restart(job, node_name: str = "node-a") -> Job:
    """The attempt is lost; the scheduler places the job again and the worker starts it."""
    attempt_lost(job, reason=f"attempt {job.attempt} stopped reporting on {node_name} for 9 s", now=timezone.now())
    job = Job.objects.get(pk=job.pk)
    if job.state != JobState.QUEUED:
        return job
    node = Node.objects.get(name=node_name)
    assert job_claim(job, node=node, gpu_indices=[0], gpu_share=1.0, run_class="medium")
    job = Job.objects.get(pk=job.pk)
    return attempt_start(job_id=job.pk, attempt_id=job.attempt_id, node_name=node_name)


def test_a_job_whose_attempts_keep_ending_without_their_worker_fails_at_the_limit(running, settings):
    """A poison job (its worker dies under it every time) is not requeued forever: at the
    MAX_LOST_ATTEMPTS-th started attempt lost, it fails with the count and the last cause."""
    settings.MAX_LOST_ATTEMPTS = 3
    job = lose_and_restart(running)
    job = lose_and_restart(job)
    assert (job.state, job.attempt) == (JobState.RUNNING, 3)
    job = lose_and_restart(job)
    assert (job.state, job.attempt, job.retries_left) == (JobState.FAILED, 3, 1)
    assert job.error == ("3 attempts ended without their worker (MAX_LOST_ATTEMPTS=3); not requeued again. "
                         "The last, attempt 3: attempt 3 stopped reporting on node-a for 9 s")
    assert kinds(job)[-3:] == ["node_lost", "running", "failed"]
    assert not GpuSlot.objects.filter(job_id=job.pk).exists()
    assert UsageRecord.objects.filter(job=job).count() == 3


def test_placements_that_never_started_do_not_count_as_lost_attempts(starting, settings):
    """A node lost before its worker started the attempt costs the job nothing, not even
    a step towards MAX_LOST_ATTEMPTS."""
    settings.MAX_LOST_ATTEMPTS = 2
    job = starting
    for _ in range(3):
        attempt_lost(job, reason="node node-a stopped reporting for 9 s", now=timezone.now())
        job = Job.objects.get(pk=job.pk)
        assert (job.state, job.attempt) == (JobState.QUEUED, 1)
        assert job_claim(job, node=Node.objects.get(name="node-a"), gpu_indices=[0], gpu_share=1.0,
                         run_class="medium")
        job = Job.objects.get(pk=job.pk)
    job = attempt_start(job_id=job.pk, attempt_id=job.attempt_id, node_name="node-a")
    job = lose_and_restart(job)
    assert (job.state, job.attempt) == (JobState.RUNNING, 2)
    assert [e.data["attempt_started"] for e in JobEvent.objects.filter(job=job, kind="node_lost")] == [
        False, False, False, True]


def test_a_lost_attempt_whose_cancel_was_asked_is_cancelled(running):
    Job.objects.filter(pk=running.pk).update(cancel_requested_at=timezone.now())
    running.refresh_from_db()
    attempt_lost(running, reason="node node-a stopped reporting", now=timezone.now())
    job = Job.objects.get(pk=running.pk)
    assert job.state == JobState.CANCELLED and kinds(job)[-1] == "cancelled"


def test_preemption_charges_and_requeues(running):
    assert attempt_preempt(running, reason="urgent job x needs the GPU", now=timezone.now())
    job = Job.objects.get(pk=running.pk)
    assert (job.state, job.attempt) == (JobState.QUEUED, 2)
    assert JobEvent.objects.get(job=job, kind="preempted").message == "preempted: urgent job x needs the GPU"
    assert UsageRecord.objects.filter(job=job, attempt=1).exists()


def test_a_retry_requeue_of_a_stale_attempt_spends_nothing(running):
    stale = Job.objects.get(pk=running.pk)
    assert job_requeue(Job.objects.get(pk=running.pk), reason="reaped")
    assert not job_requeue(stale, reason="failed; retrying", kind="retry", retry=True)
    job = Job.objects.get(pk=running.pk)
    assert (job.retries_left, job.attempt) == (1, 2)


def test_a_val_start_event_carries_the_child_s_note(running):
    """The child's word on how it ran (half precision asked on a CPU node: worker/model_modes.cpu_half_note)."""
    attempt_event_record(running, {"type": "started", "mode": "val", "split": "val",
                                   "note": "half precision needs a GPU: ran FP32"})
    event = JobEvent.objects.get(job=running, kind="val_started")
    assert event.message == "validating on the val split; half precision needs a GPU: ran FP32"
