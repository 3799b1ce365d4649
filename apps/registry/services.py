from __future__ import annotations

from pathlib import Path

from django.db import IntegrityError, transaction
from django.db.models import F, Max
from django.db.models.functions import Greatest

from apps.core.hashing import file_sha256

from .models import ModelVersion, VersionCounter


def version_next(*, kind: str, team, name: str, floor: int = 0) -> int:
    """Issue the next version number of (kind, team, name); call it inside the transaction that
    creates the row, so a failed create gives the number back. ``floor`` is the highest
    number already in use (rows made before the counter existed)."""
    counter, _ = VersionCounter.objects.get_or_create(kind=kind, team=team, name=name, defaults={"last": floor})
    VersionCounter.objects.filter(pk=counter.pk).update(last=Greatest(F("last"), floor) + 1)
    return VersionCounter.objects.values_list("last", flat=True).get(pk=counter.pk)


def model_register(*, job, weights: Path, metrics: dict) -> ModelVersion:
    """Register a succeeded job's weights as the next version of its task name (idempotent per job)."""
    existing = ModelVersion.objects.filter(job=job).first()
    if existing:
        return existing
    for _ in range(5):
        try:
            with transaction.atomic():
                latest = ModelVersion.objects.filter(team=job.team, name=job.task_name).aggregate(v=Max("version"))["v"]
                version = version_next(kind="model", team=job.team, name=job.task_name, floor=latest or 0)
                return ModelVersion.objects.create(
                    team=job.team, name=job.task_name, version=version, job=job,
                    weights_path=str(weights), sha256=file_sha256(weights), size=weights.stat().st_size,
                    metrics=metrics,
                )
        except IntegrityError:
            continue  # another job of the same name registered at the same moment
    raise RuntimeError(f"could not register a model version for job {job.pk}")


def model_version_delete(*, version: ModelVersion, by) -> None:
    """Delete a registered version (audited). Its number is not issued again; the job's own
    weights file stays with the job."""
    from apps.accounts.models import AuditEntry
    from apps.accounts.services import audit_record

    target_id, label = str(version.pk), str(version)
    data = {"name": version.name, "version": version.version, "sha256": version.sha256,
            "job": str(version.job_id) if version.job_id else None}
    version.delete()
    audit_record(actor=by, action=AuditEntry.Action.MODEL_DELETE, team=version.team_id, target=version,
                 target_id=target_id, message=f"model {label} deleted", data=data)
