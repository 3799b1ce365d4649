from __future__ import annotations

from pathlib import Path

from django.db import IntegrityError, transaction
from django.db.models import Max

from apps.core.hashing import file_sha256

from .models import ModelVersion


def model_register(*, job, weights: Path, metrics: dict) -> ModelVersion:
    """Register a succeeded job's weights as the next version of its task name (idempotent per job)."""
    existing = ModelVersion.objects.filter(job=job).first()
    if existing:
        return existing
    for _ in range(5):
        try:
            with transaction.atomic():
                latest = ModelVersion.objects.filter(team=job.team, name=job.task_name).aggregate(v=Max("version"))["v"]
                return ModelVersion.objects.create(
                    team=job.team, name=job.task_name, version=(latest or 0) + 1, job=job,
                    weights_path=str(weights), sha256=file_sha256(weights), size=weights.stat().st_size,
                    metrics=metrics,
                )
        except IntegrityError:
            continue  # another job of the same name registered at the same moment
    raise RuntimeError(f"could not register a model version for job {job.pk}")
