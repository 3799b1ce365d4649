"""How an attempt that ran out of memory ends (issue 12), through jobs.services.

- The kernel's OOM killer in the attempt's cgroup: ``failed`` with the stated reason, no retry.
- CUDA out of memory: requeued from the last checkpoint with half the batch, at most
  ``CUDA_OOM_RETRIES`` times, recorded in the timeline and in the spec as run.
- Events a training child reports are recorded the same for every executor; a checkpoint
  outside the job's folder is refused.
"""

from __future__ import annotations

import pytest

from apps.jobs.models import Checkpoint, Job, JobEvent, JobState
from apps.jobs.services import attempt_event_record, attempt_finish, attempt_start, job_claim
from worker.executors.base import oom_message, run_outcome
from worker.executors.cgroups import Usage

from .factories import make_job

pytestmark = pytest.mark.django_db

OOM_TEXT = ("out of memory: used 4.0 GiB of its 4 GiB limit — ask for more memory "
            "or a smaller batch/imgsz/cache")


@pytest.fixture
def running(alice, teams, node):
    job = make_job(team=teams["vision"], user=alice, gpus=1, retries_left=2)
    assert job_claim(job, node=node, gpu_indices=[0], gpu_share=1.0, run_class="medium")
    return attempt_start(job_id=job.pk, attempt_id=job.attempt_id, node_name="node-a")


def restart(job: Job) -> Job:
    """The scheduler places the requeued job again and the worker starts its next attempt."""
    job = Job.objects.get(pk=job.pk)
    assert job_claim(job, node=running_node(), gpu_indices=[0], gpu_share=1.0, run_class="medium")
    return attempt_start(job_id=job.pk, attempt_id=job.attempt_id, node_name="node-a")


def running_node():
    from apps.cluster.models import Node

    return Node.objects.get(name="node-a")


def events(job, kind: str) -> list[JobEvent]:
    return list(JobEvent.objects.filter(job_id=job.pk, kind=kind).order_by("seq"))


# --- the kernel's OOM killer ------------------------------------------------------------------


def test_the_oom_message_states_use_limit_and_advice():
    usage = Usage(memory_peak_bytes=4 * 2**30, memory_limit_bytes=4 * 2**30, oom_kills=1)
    assert oom_message(usage) == OOM_TEXT


def test_an_oom_kill_in_the_cgroup_is_out_of_memory_whatever_the_exit_code():
    """The victim may be a dataloader worker: the child then fails on its own with exit 1."""
    usage = Usage(oom_kills=1)
    assert run_outcome(exit_code=-9, finished=None, resumed=False, usage=usage) == "out_of_memory"
    assert run_outcome(exit_code=1, finished=None, resumed=False, usage=usage) == "out_of_memory"
    assert run_outcome(exit_code=-9, finished=None, resumed=False, usage=Usage()) == "killed"
    assert run_outcome(exit_code=0, finished={"weights": "x"}, resumed=False, usage=usage) == "succeeded"


def test_an_attempt_killed_for_memory_fails_with_the_reason_and_spends_no_retry(running):
    assert attempt_finish(running, outcome="out_of_memory", exit_code=-9, error=OOM_TEXT) == "failed"
    job = Job.objects.get(pk=running.pk)
    assert (job.state, job.retries_left, job.attempt) == (JobState.FAILED, 2, 1)
    assert job.error == OOM_TEXT
    assert events(job, "failed")[0].message == OOM_TEXT


# --- CUDA out of memory -----------------------------------------------------------------------


def test_cuda_oom_is_retried_from_the_checkpoint_with_half_the_batch(running):
    assert attempt_finish(running, outcome="failed", exit_code=1, error="CUDA out of memory: …",
                          cuda_oom_batch=16) == "requeued"
    job = Job.objects.get(pk=running.pk)
    assert (job.state, job.attempt, job.retries_left) == (JobState.QUEUED, 2, 2)
    assert job.spec["as_run"] == {"batch": 8, "cuda_oom_retries": 1, "batch_history": [16]}
    assert job.spec["train_args"]["epochs"] == 1  # the rest of the spec is what was asked
    [event] = events(job, "cuda_oom")
    # No epoch had finished: the message does not promise a checkpoint (it did, on an H200).
    assert "CUDA out of memory with batch=16: retrying from the start (no epoch had finished) with batch=8 (1 of 2" \
        in event.message


def test_cuda_oom_retries_stop_after_two_and_the_job_fails(running):
    job = running
    for batch in (16, 8):
        assert attempt_finish(job, outcome="failed", exit_code=1, error="CUDA out of memory: x",
                              cuda_oom_batch=batch) == "requeued"
        job = restart(job)
    Job.objects.filter(pk=job.pk).update(retries_left=0)
    job.refresh_from_db()
    assert attempt_finish(job, outcome="failed", exit_code=1, error="CUDA out of memory: x",
                          cuda_oom_batch=4) == "failed"
    job = Job.objects.get(pk=job.pk)
    assert job.state == JobState.FAILED and job.attempt == 3
    assert job.spec["as_run"] == {"batch": 4, "cuda_oom_retries": 2, "batch_history": [16, 8]}
    assert len(events(job, "cuda_oom")) == 2


def test_a_batch_of_one_cannot_halve(running):
    Job.objects.filter(pk=running.pk).update(retries_left=0)
    running.refresh_from_db()
    assert attempt_finish(running, outcome="failed", exit_code=1, error="CUDA out of memory: x",
                          cuda_oom_batch=1) == "failed"


def test_the_worker_trains_with_the_batch_as_run(running):
    from worker.tasks import child_config

    Job.objects.filter(pk=running.pk).update(spec={**running.spec, "as_run": {"batch": 8, "cuda_oom_retries": 1},
                                                   "resolved": {"model": "yolov8n.yaml", "data_yaml": "/d.yaml"}})
    job = Job.objects.select_related("node").get(pk=running.pk)
    job.spec["train_args"]["batch"] = 16
    config = child_config(job, resume_from=None, events_path=job.run_dir / "e.jsonl")
    assert config["args"]["batch"] == 8


# --- events, the same for every executor ------------------------------------------------------


def test_events_record_metrics_checkpoints_and_the_start(running):
    path = running.run_dir / "checkpoints" / "epoch-0001.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"0123456789")
    attempt_event_record(running, {"type": "started", "epochs": 3, "start_epoch": 1, "batch": 16,
                                   "save_dir": str(running.run_dir / "train")})
    attempt_event_record(running, {"type": "epoch", "epoch": 1, "values": {"train/box_loss": 1.5}})
    attempt_event_record(running, {"type": "checkpoint", "epoch": 1, "path": str(path), "sha256": "a" * 64,
                                   "size": 10})
    job = Job.objects.get(pk=running.pk)
    assert job.epochs_done == 1 and job.metrics.get().values == {"train/box_loss": 1.5}
    started = events(job, "training_started")[0]
    assert started.message == "training epochs 1..3 with batch=16" and "save_dir" not in started.data
    assert Checkpoint.objects.get(job=job, epoch=1).path == str(path)


def test_a_checkpoint_outside_the_jobs_folder_is_refused(running, tmp_path):
    outside = tmp_path / "epoch-0001.pt"
    outside.write_bytes(b"x")
    attempt_event_record(running, {"type": "checkpoint", "epoch": 1, "path": str(outside), "sha256": "a" * 64,
                                   "size": 1})
    assert not Checkpoint.objects.filter(job=running).exists()
