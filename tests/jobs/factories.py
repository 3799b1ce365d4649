"""Small helpers that make rows directly (fast), for tests that are not about submitting."""

from __future__ import annotations

import hashlib
import uuid

from apps.jobs.models import Job
from apps.jobs.services import checkpoint_record


def make_job(*, team, user, state: str = "queued", task_name: str = "t", **fields) -> Job:
    return Job.objects.create(
        task_name=task_name,
        team=team,
        user=user,
        state=state,
        spec={"task": "detect", "train_args": {"data": "demo", "model": "yolov8n.yaml", "epochs": 1}},
        spec_hash=uuid.uuid4().hex,
        timeout_s=3600,
        **fields,
    )


def stored_checkpoint(job: Job, epoch: int, *, best: bool = False) -> bytes:
    """A checkpoint file in the job's run folder, recorded as its worker records one (and the
    job's epochs_done moved to it); its bytes."""
    data = f"checkpoint of {job.pk} epoch {epoch}".encode()
    path = job.run_dir / "checkpoints" / f"epoch-{epoch:04d}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    checkpoint_record(job, epoch=epoch, path=str(path), sha256=hashlib.sha256(data).hexdigest(), size=len(data),
                      best=best)
    Job.objects.filter(pk=job.pk).update(epochs_done=epoch)
    return data
