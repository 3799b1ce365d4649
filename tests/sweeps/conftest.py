"""Sweeps driven through the real services: submit, the sweep step, and each trial's attempt as the
worker reports it (claim, start, one metric point per epoch, outcome) — no worker process."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.conf import settings

from apps.jobs.models import Job
from apps.jobs.services import attempt_finish, attempt_start, job_claim, job_submit, metrics_record
from apps.jobs.spec import parse_spec
from tests.security.fast import _fast_password_hashing  # noqa: F401

METRIC = "metrics/mAP50-95(B)"


def sweep_spec(*, epochs: int = 3, name: str = "lr-sweep", **sweep) -> dict:
    return {"task_name": name, "command": f"yolo train data=demo model=yolov8n.yaml epochs={epochs} imgsz=64 optimizer=SGD",
            "resources": {"gpu": 1}, "user": "vision", "sweep": sweep}


def submit_sweep(user, **spec) -> Job:
    job, created = job_submit(user=user, spec=parse_spec(sweep_spec(**spec)))
    assert created
    return job


def trial_jobs(parent: Job, *states: str) -> list[Job]:
    jobs = Job.objects.filter(parent=parent).order_by("created_at")
    return list(jobs.filter(state__in=states) if states else jobs)


def start(job: Job, node, gpu: int = 0) -> Job:
    job = Job.objects.get(pk=job.pk)
    assert job_claim(job, node=node, gpu_indices=[gpu], gpu_share=1.0, run_class=job.priority_class)
    job = Job.objects.get(pk=job.pk)
    return attempt_start(job_id=job.pk, attempt_id=job.attempt_id, node_name=node.name)


def report(job: Job, epoch: int, value: float) -> None:
    metrics_record(Job.objects.get(pk=job.pk), epoch=epoch, values={METRIC: value, "metrics/mAP50(B)": value * 1.5})


def finish(job: Job, outcome: str = "succeeded", final: float | None = None) -> str:
    """End the running attempt as the worker would (a weights file under the job's folder on success)."""
    job = Job.objects.get(pk=job.pk)
    finished = None
    if outcome == "succeeded":
        weights = Path(settings.JOBS_DIR) / str(job.pk) / "train" / "weights" / "best.pt"
        weights.parent.mkdir(parents=True, exist_ok=True)
        weights.write_bytes(f"weights of {job.pk}".encode())
        finished = {"weights": str(weights), "metrics": {METRIC: final} if final is not None else {},
                    "code": {"ultralytics": "test"}}
    return attempt_finish(job, outcome=outcome, exit_code=0 if outcome != "failed" else 1,
                          error="boom" if outcome == "failed" else "", finished=finished)


def train(job: Job, node, curve: list[float], outcome: str = "succeeded", gpu: int = 0) -> str:
    job = start(job, node, gpu)
    for epoch, value in enumerate(curve, start=1):
        report(job, epoch, value)
    return finish(job, outcome, final=curve[-1] if curve and outcome == "succeeded" else None)


@pytest.fixture
def sweeper(alice, demo_registered, node, clean_storage):
    """alice of team vision, the demo dataset registered, node-a with 2 simulated GPUs."""
    return alice
