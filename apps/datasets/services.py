from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import IO

import yaml
from django.conf import settings
from django.db import IntegrityError

from apps.accounts.models import AuditEntry
from apps.accounts.services import audit_record

from .archive import ArchiveLimits, ArchiveRejected, Problem, archive_extract, archive_inspect, data_yaml_text
from .models import Dataset
from .selectors import data_yaml_check, team_dataset_root


class DatasetExists(ValueError):
    pass


def dataset_register(*, team, name: str, yaml_path: Path, description: str = "") -> Dataset:
    document = yaml.safe_load(Path(yaml_path).read_text()) or {}
    names = document.get("names") or {}
    base = Path(document.get("path") or Path(yaml_path).parent)
    images = sum(1 for p in base.rglob("*") if p.suffix.lower() in {".jpg", ".jpeg", ".png", ".bmp"})
    dataset, _ = Dataset.objects.update_or_create(
        team=team, name=name,
        defaults={"yaml_path": str(yaml_path), "num_classes": len(names), "num_images": images,
                  "description": description},
    )
    return dataset


def upload_limits() -> ArchiveLimits:
    return ArchiveLimits(
        max_compressed_bytes=settings.DATASET_UPLOAD_MAX_BYTES,
        max_uncompressed_bytes=settings.DATASET_MAX_UNCOMPRESSED_BYTES,
        max_files=settings.DATASET_MAX_FILES,
        max_ratio=settings.DATASET_MAX_RATIO,
    )


def dataset_upload(*, user, team, name: str, upload: IO[bytes], size: int, description: str = "") -> Dataset:
    """Check a zipped YOLO dataset, extract it into the team's dataset root and register it.

    1. Refuse a name already used in the team (DatasetExists).
    2. Inspect the archive without extracting (ArchiveRejected with a per-file report).
    3. Extract into a hidden folder beside the final one, write the platform's data.yaml
       (absolute ``path``) and check it as a submit would.
    4. Rename into place and register; on any failure the hidden folder is removed.
    """
    root = team_dataset_root(team)
    final = root / name
    if Dataset.objects.filter(team=team, name=name).exists() or final.exists():
        raise DatasetExists(f"your team already has a dataset named {name!r}")
    plan = archive_inspect(upload, size=size, limits=upload_limits())
    root.mkdir(parents=True, exist_ok=True)
    staging = root / f".upload-{uuid.uuid4().hex}"
    try:
        archive_extract(upload, plan, destination=staging)
        yaml_path = staging / "data.yaml"
        yaml_path.write_text(data_yaml_text(plan, dataset_dir=final))
        try:
            data_yaml_check(yaml_path, root=staging.resolve().parent)
        except ValueError as exc:
            raise ArchiveRejected(str(exc), [Problem("data.yaml", str(exc))]) from None
        try:
            staging.rename(final)
        except OSError:
            raise DatasetExists(f"your team already has a dataset named {name!r}") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    try:
        dataset = Dataset.objects.create(
            team=team, name=name, yaml_path=str(final / "data.yaml"), num_images=plan.num_images,
            num_classes=len(plan.names), description=description,
        )
    except IntegrityError:
        shutil.rmtree(final, ignore_errors=True)
        raise DatasetExists(f"your team already has a dataset named {name!r}") from None
    audit_record(actor=user, action=AuditEntry.Action.DATASET_UPLOAD, team=team, target=dataset,
                 message=f"dataset {name!r} uploaded: {plan.num_images} images, {len(plan.names)} classes",
                 data={"name": name, "images": plan.num_images, "bytes": plan.uncompressed_bytes})
    return dataset


def dataset_delete(*, dataset: Dataset, by) -> None:
    """Delete a dataset (audited) so that it cannot be trained on any more.

    The row goes, and so do its files when they are the team's own (inside the team's
    dataset root): otherwise ``data=<name>`` would still resolve as a path in that root
    (issue 9, finding 9). A registered dataset outside the root (the shared demo) keeps
    its files; without the row this team can no longer name it. The folder is first
    renamed to a hidden name (path references refuse hidden components), then removed.
    """
    root = team_dataset_root(dataset.team)
    folder = Path(dataset.yaml_path).parent.resolve()
    owned = folder != root and folder.is_relative_to(root) and folder.is_dir()
    target_id, name, team = str(dataset.pk), dataset.name, dataset.team
    dataset.delete()
    if owned:
        doomed = root / f".deleted-{uuid.uuid4().hex}"
        folder.rename(doomed)
        shutil.rmtree(doomed, ignore_errors=True)
    audit_record(actor=by, action=AuditEntry.Action.DATASET_DELETE, team=team, target=dataset, target_id=target_id,
                 message=f"dataset {name!r} deleted{' with its files' if owned else ''}",
                 data={"name": name, "files_removed": owned})
