from __future__ import annotations

import contextlib
import re
import shutil
import uuid
from pathlib import Path
from typing import IO, NamedTuple

from django.conf import settings
from django.db import transaction
from django.db.models import Max

from apps.accounts.models import AuditEntry, Team
from apps.accounts.services import (
    StorageQuotaExceeded,
    audit_record,
    storage_adjust,
    storage_release,
    storage_reserve,
)
from apps.core.artifacts import ArtifactKeyError, artifact_key, artifact_path, key_join
from apps.core.guards import ensure_deletable
from apps.core.strict_yaml import YamlError, load_yaml
from apps.core.versions import version_next

from .archive import (
    ArchiveLimits,
    ArchiveRejected,
    Problem,
    archive_extract,
    archive_inspect,
    class_id,
    data_yaml_text,
    kpt_shape_problem,
    skipped_summary,
)
from .models import Dataset
from .selectors import DATA_YAML_MAX_BYTES, data_yaml_check, team_dataset_root
from .stats import classification_stats, dataset_stats, images_stats, manifest_sha256

NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,99}$")
NAME_RULE = "use lowercase letters, digits, '-' and '_', starting with a lowercase letter or digit (e.g. pcb_defect)"

__all__ = ["ArchiveRejected", "DatasetUpload", "StorageQuotaExceeded", "dataset_delete", "dataset_register",
           "dataset_upload"]


class DatasetUpload(NamedTuple):
    dataset: Dataset
    created: bool  # False: the newest version already held exactly these files
    skipped: list[str]  # what the archive held that was not stored (README.md, LICENSE, __MACOSX/ …)


def _names_and_splits(yaml_path: Path) -> tuple[list[str], dict[str, str], list[int] | None]:
    """(class names, split → images folder relative to the YAML, ``kpt_shape`` of a pose dataset or None)."""
    document = load_yaml(yaml_path.read_bytes()[: DATA_YAML_MAX_BYTES + 1], max_bytes=DATA_YAML_MAX_BYTES)
    names = document.get("names") or {}
    if isinstance(names, dict):  # {"10": x, "2": y} in class-id order, as Ultralytics reads it (not "10" < "2")
        names = [str(names[k]) for k in sorted(names, key=lambda k: (class_id(k) is None, class_id(k) or 0, str(k)))]
    base = Path(document["path"]) if document.get("path") else yaml_path.parent
    splits = {}
    for key in ("train", "val", "test"):
        value = document.get(key)
        if isinstance(value, str) and value:
            folder = (base / value).resolve()
            if folder.is_relative_to(yaml_path.parent.resolve()):
                splits[key] = folder.relative_to(yaml_path.parent.resolve()).as_posix()
    kpt_shape = document.get("kpt_shape")
    if kpt_shape is not None and kpt_shape_problem(kpt_shape):
        kpt_shape = None
    return [str(n) for n in names], splits, kpt_shape


def dataset_register(*, team, name: str, yaml_path: Path, description: str = "", by=None) -> Dataset:
    """Register a data.yaml that is already in the data store (the demo, an operator's copy).

    The same file registered again under the same name refreshes that version (so
    ``demo_setup`` can run twice); another file becomes the next version, refused as an upload of
    another kind is (:func:`_refuse_kind_switch`). Raises ValueError for that, for a file outside
    the data store or a YAML Ultralytics would execute.
    """
    yaml_path = Path(yaml_path).resolve()
    try:
        yaml_key = artifact_key(yaml_path)
    except ArtifactKeyError as exc:
        raise ValueError(str(exc)) from None
    folder = yaml_path.parent
    data_yaml_check(yaml_path, root=folder)
    try:
        names, splits, kpt_shape = _names_and_splits(yaml_path)
    except YamlError as exc:
        raise ValueError(f"dataset YAML {exc.errors.get('spec', exc)}") from None
    stats = dataset_stats(folder, names=names, splits=splits, kpt_shape=kpt_shape)
    sha256, size, _ = manifest_sha256(folder)
    from apps.core.storage import artifact_folder_upload

    # With an object store its files go there first (nothing on the shared filesystem; an
    # unreachable store raises StorageUnavailable before any row changes): GPU servers and web
    # machines without this DATA_DIR read the version from there.
    artifact_folder_upload(artifact_key(folder), folder)
    values = {"kind": Dataset.Kind.YOLO, "key": artifact_key(folder), "sha256": sha256, "size_bytes": size,
              "num_images": sum(s["images"] for s in stats["splits"].values()), "num_classes": len(names),
              "names": names, "stats": stats, "description": description}
    with transaction.atomic():
        existing = Dataset.objects.filter(team=team, name=name, yaml_key=yaml_key).order_by("-version").first()
        if existing:
            Dataset.objects.filter(pk=existing.pk).update(**values)
            existing.refresh_from_db()
            return existing
        latest = Dataset.objects.filter(team=team, name=name).aggregate(v=Max("version"))["v"] or 0
        version = version_next(kind="dataset", team=team, name=name, floor=latest)
        # The uploads' rule, once the name's counter row is held: a registered YAML made a YOLO version of
        # a classification name, and data=NAME then failed every training.
        _refuse_kind_switch(team=team, name=name, kind=Dataset.Kind.YOLO)
        return Dataset.objects.create(team=team, name=name, version=version, yaml_key=yaml_key, uploaded_by=by,
                                      **values)


def upload_limits() -> ArchiveLimits:
    return ArchiveLimits(
        max_compressed_bytes=settings.DATASET_UPLOAD_MAX_BYTES,
        max_uncompressed_bytes=settings.DATASET_MAX_UNCOMPRESSED_BYTES,
        max_files=settings.DATASET_MAX_FILES,
        max_ratio=settings.DATASET_MAX_RATIO,
    )


def dataset_upload(*, user, team, name: str, upload: IO[bytes], size: int, description: str = "",
                   kind: str = Dataset.Kind.YOLO) -> DatasetUpload:
    """Check a zipped dataset, store it as the next version of ``name`` and register it:
    ``(version, True, skipped)``; or ``(newest version, False, skipped)`` when that already holds
    exactly these files (same kind, same manifest hash): pushing an unchanged folder again makes no
    version. ``skipped`` names what was left out (documentation beside data.yaml, OS clutter).

    1. Inspect the archive without extracting (ArchiveRejected with a per-file report).
    2. Charge its unpacked size to the team's storage quota (StorageQuotaExceeded).
    3. Extract into a hidden folder in the team's root, write the platform's data.yaml
       (relative folders, no ``path``) and check it as a submit would; count the splits,
       the class histogram and a few samples; hash the file manifest.
    4. Files identical to the newest version's: stop here, nothing kept, nothing charged.
    5. In one transaction: issue the version number, rename the folder to
       ``<name>/v<N>``, create the row, move the charge to the version's key.
    6. With an object store, copy the version's files into it (:func:`_dataset_store`).
    On any failure the hidden folder and the charge go; no version number is spent (but in 6).
    """
    if not NAME.match(name):
        raise ArchiveRejected("has no usable name", [Problem("name", NAME_RULE)])
    plan = archive_inspect(upload, size=size, limits=upload_limits(), kind=kind)
    if plan.kind == Dataset.Kind.CLASSIFY:
        kind = Dataset.Kind.CLASSIFY  # the default kind's upload found to be a classification folder
    _refuse_kind_switch(team=team, name=name, kind=kind)
    root = team_dataset_root(team)
    token = uuid.uuid4().hex
    staging = root / f".upload-{token}"
    charge = f"upload:{team.slug}:{token}"
    with transaction.atomic():
        _team_held(team)
        storage_reserve(team=team, key=charge, size=plan.uncompressed_bytes)
    try:
        root.mkdir(parents=True, exist_ok=True)
        archive_extract(upload, plan, destination=staging)
        if kind in (Dataset.Kind.YOLO, Dataset.Kind.CLASSIFY):
            # A classification version gets a data.yaml too (its splits and class names): Ultralytics
            # reads the folder itself (worker/train_child.py), the rest of the platform reads the YAML.
            yaml_path = staging / "data.yaml"
            yaml_path.write_text(data_yaml_text(plan))
            try:
                data_yaml_check(yaml_path, root=staging.resolve())
            except ValueError as exc:
                raise ArchiveRejected(str(exc), [Problem("data.yaml", str(exc))]) from None
            names = [plan.names[i] for i in sorted(plan.names)]
            if kind == Dataset.Kind.CLASSIFY:
                stats = classification_stats(staging, names=names, splits=plan.splits)
            else:
                stats = dataset_stats(staging, names=names, splits=plan.splits, kpt_shape=plan.kpt_shape)
        else:
            names, stats = [], images_stats(staging)
        skipped = skipped_summary(plan)
        if skipped:  # kept with the version: its page lists them (a browser upload leaves for that page at once)
            stats = {**stats, "skipped": skipped}
        sha256, stored_bytes, _ = manifest_sha256(staging)
        newest = Dataset.objects.filter(team=team, name=name).order_by("-version").first()
        if newest is not None and newest.kind == kind and newest.sha256 == sha256:
            # Two identical pushes racing both make a version (each sees only committed rows):
            # harmless, and rare enough not to take a lock for.
            shutil.rmtree(staging, ignore_errors=True)
            storage_release(key=charge)
            return DatasetUpload(newest, False, skipped)
        dataset = _dataset_commit(team=team, name=name, kind=kind, staging=staging, charge=charge, values={
            "sha256": sha256, "size_bytes": stored_bytes, "num_images": plan.num_images, "num_classes": len(names),
            "names": names, "stats": stats, "description": description, "uploaded_by": user})
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        storage_release(key=charge)
        if isinstance(exc, ArchiveRejected) and exc.field == "team":
            with contextlib.suppress(OSError):  # the deleted team's folder, when nothing else is in it
                root.rmdir()
        raise
    _dataset_store(dataset)
    audit_record(actor=user, action=AuditEntry.Action.DATASET_UPLOAD, team=team, target=dataset,
                 message=f"dataset {dataset.reference} uploaded: {plan.num_images} images, {len(names)} classes",
                 data={"name": name, "version": dataset.version, "images": plan.num_images,
                       "bytes": dataset.size_bytes, "sha256": dataset.sha256, "kind": kind})
    return DatasetUpload(dataset, True, skipped)


KIND_PLURAL = {Dataset.Kind.YOLO: "YOLO datasets (data.yaml, images and labels)",
               Dataset.Kind.CLASSIFY: "classification datasets (a folder of images per class)",
               Dataset.Kind.IMAGES: "uploads of images to predict on"}
KIND_ONE = {Dataset.Kind.YOLO: "a YOLO dataset", Dataset.Kind.CLASSIFY: "a classification dataset",
            Dataset.Kind.IMAGES: "images to predict on"}


def _refuse_kind_switch(*, team, name: str, kind: str) -> None:
    """ArchiveRejected (on ``name``) when ``name``'s newest version is of another kind.

    ``data=name`` means the newest version, so a classification folder or an images upload pushed
    under a YOLO dataset's name (a wrong ``--name`` typed in a hurry) turned every spec naming it
    into a refusal, and so does YOLO <-> classify (trial25 F7), as a registered model name keeps one
    task (apps.registry.services.version_number_claim). An images name may take its labelled dataset. Called before extracting (nothing done in vain)
    and again in :func:`_dataset_commit` once the name's counter row is held (two uploads at once);
    :func:`dataset_register` makes the same check for a registered data.yaml (a YOLO dataset).
    """
    newest = Dataset.objects.filter(team=team, name=name).order_by("-version").only("kind", "version").first()
    if newest is None or newest.kind == kind:
        return
    if newest.kind == Dataset.Kind.IMAGES:
        # Images labelled later, pushed under their name (what `yoloq dataset push` advises after an
        # images push): a predict's source= takes a YOLO or classification dataset too, so no spec
        # naming it breaks (review28). The other way, or YOLO <-> classify, breaks every training's data=.
        return
    other = {Dataset.Kind.CLASSIFY: "classify", Dataset.Kind.IMAGES: "images"}.get(kind, "yolo")
    message = (f"{name}'s versions (newest {name}:v{newest.version}) are {KIND_PLURAL.get(newest.kind, newest.kind)}, "
               f"and this upload is {KIND_ONE.get(kind, kind)}: a name's versions are one kind, so that "
               f"data={name} never switches kind. Give it another name (e.g. {name}-{other})")
    raise ArchiveRejected(message, field="name")


def _dataset_store(dataset: Dataset) -> None:
    """Put a new version's files into an object store before anyone is told about it (nothing
    to do on the shared filesystem): GPU servers without the web's DATA_DIR fetch them from there.

    While the store is unreachable (StorageUnavailable, a 503 to the uploader) the version goes
    again, files and charge with it; its number stays spent (numbers are never issued twice).
    """
    from apps.core.storage import artifact_folder_upload

    folder = artifact_path(dataset.key)
    try:
        artifact_folder_upload(dataset.key, folder)
    except BaseException:
        dataset.delete()
        storage_release(key=dataset.key)
        shutil.rmtree(folder, ignore_errors=True)
        raise


TEAM_GONE = "team {slug} was deleted while this upload was being checked: nothing was stored"


def _team_held(team) -> None:
    """Lock ``team``'s row for the rest of the transaction (PostgreSQL; SQLite's writers are serialised
    anyway); ArchiveRejected on ``team`` when it has been deleted.

    A superuser may delete a team that owns no dataset version (accounts.services.team_delete_refusal)
    while one of its uploads is being extracted and checked, unlocked: the version's insert then failed
    at its commit (the foreign keys are checked there), a 500 that left the files renamed to
    ``<name>/v<N>`` (left32). Held from here to the commit, the row cannot go meanwhile, and once the
    version is committed the team is not deleted while it owns it (Dataset.team is PROTECT)."""
    if not list(Team.objects.select_for_update().filter(pk=team.pk).values_list("pk", flat=True)):
        raise ArchiveRejected(TEAM_GONE.format(slug=team.slug), field="team")


def _dataset_commit(*, team, name: str, kind: str, staging: Path, charge: str, values: dict) -> Dataset:
    final: Path | None = None
    try:
        with transaction.atomic():
            _team_held(team)
            latest = Dataset.objects.filter(team=team, name=name).aggregate(v=Max("version"))["v"] or 0
            version = version_next(kind="dataset", team=team, name=name, floor=latest)
            # Again here, after the name's counter row is held (version_next), so that two uploads of
            # different kinds under a new name cannot both pass the check made before extracting.
            _refuse_kind_switch(team=team, name=name, kind=kind)
            key = key_join("datasets", team.slug, name, f"v{version}")
            final = artifact_path(key)
            final.parent.mkdir(parents=True, exist_ok=True)
            if final.exists():
                # No row holds this number (it was just issued, and numbers are never reused): the folder is
                # what a crash between the rename and the commit (or a reset database) left behind.
                stale = staging.parent / f".stale-{uuid.uuid4().hex}"
                final.rename(stale)
                shutil.rmtree(stale, ignore_errors=True)
            staging.rename(final)
            dataset = Dataset.objects.create(
                team=team, name=name, version=version, kind=kind, key=key,
                yaml_key=f"{key}/data.yaml" if kind != Dataset.Kind.IMAGES else "", **values)
            storage_adjust(key=charge, size=values["size_bytes"], new_key=key)
    except BaseException:
        # Inside the transaction or at its commit (foreign keys are checked there): the folder goes back
        # to its staging name, which the caller's cleanup removes (it removed only that name: left32).
        if final is not None and final.exists() and not staging.exists():
            final.rename(staging)
        raise
    return dataset


def dataset_delete(*, dataset: Dataset, by) -> None:
    """Delete one dataset version (audited) so that it cannot be used any more.

    The row goes, its storage charge is released, and its files go when they are the
    team's own (inside the team's dataset root): otherwise ``data=<path>`` would still
    resolve them (issue 9, finding 9). A registered dataset outside the root (the shared
    demo) keeps its files. The folder is first renamed to a hidden name (path references
    refuse hidden components), then removed; an emptied ``<name>/`` folder goes too. Its
    version number is never issued again. Refused (``InUse``) while an active job reads it.
    """
    ensure_deletable(dataset)
    root = team_dataset_root(dataset.team)
    folder = artifact_path(dataset.key).resolve() if dataset.key else None
    owned = folder is not None and folder != root and folder.is_relative_to(root) and folder.is_dir()
    target_id, name, team, version = str(dataset.pk), dataset.name, dataset.team, dataset.version
    dataset.delete()
    storage_release(key=dataset.key)
    from apps.core.storage import artifact_forget, shared_filesystem

    if not shared_filesystem() and dataset.key.startswith(f"datasets/{team.slug}/"):
        # The team's own version (not the shared demo): out of the object store too. The web
        # machine handling this need not have the files, so ownership is read from the key.
        artifact_forget([], folders=[dataset.key])
    if owned:
        doomed = root / f".deleted-{uuid.uuid4().hex}"
        folder.rename(doomed)
        shutil.rmtree(doomed, ignore_errors=True)
        parent = folder.parent
        if parent != root and parent.is_relative_to(root) and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
    audit_record(actor=by, action=AuditEntry.Action.DATASET_DELETE, team=team, target=dataset, target_id=target_id,
                 message=f"dataset {name}:v{version} deleted{' with its files' if owned else ''}",
                 data={"name": name, "version": version, "files_removed": owned})
