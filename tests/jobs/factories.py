"""Small helpers that make rows directly (fast), for tests that are not about submitting."""

from __future__ import annotations

import uuid

from apps.jobs.models import Job


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
