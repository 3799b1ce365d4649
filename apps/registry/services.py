"""Writes about the registry: versions from training and uploads, stages, evaluations, exports,
predictions, shared base weights.

Weights are only ever *loaded* by training children. Here they are copied, hashed and
checked with :mod:`apps.registry.checkpoint_scan` (a restricted unpickling pass that
constructs nothing), never loaded.
"""

from __future__ import annotations

import os
import re
import shutil
import unicodedata
import uuid
from pathlib import Path
from typing import IO

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone

from apps.accounts.models import AuditEntry
from apps.accounts.services import audit_record, storage_adjust, storage_release, storage_reserve
from apps.core.artifacts import artifact_key, artifact_path, key_join, key_part, root_path
from apps.core.guards import ensure_deletable
from apps.core.hashing import file_sha256
from apps.core.versions import version_next
from apps.datasets.models import Dataset

from .checkpoint_scan import CheckpointRefused, member_name_problem, scan_checkpoint
from .models import Evaluation, Export, ModelVersion, PredictionRun, SharedWeights, Stage, trained_class_names
from .selectors import model_name_task


class NameOfAnotherTask(ValueError):
    """``name``'s versions are ``registered`` models; weights of ``task`` may not become one of them."""

    def __init__(self, *, name: str, registered: str, task: str, versions: list[str]):
        self.name, self.registered, self.task, self.versions = name, registered, task, versions
        shown = ", ".join(versions[:3]) + (" …" if len(versions) > 3 else "")
        super().__init__(f"{name}'s versions are {registered} models ({shown})")


class WeightsRefused(ValueError):
    """An upload of weights is refused; ``field`` is the request field it is about."""

    def __init__(self, message: str, *, field: str = "file", offending: str = ""):
        self.field, self.offending = field, offending
        super().__init__(message)


# --- versions from training -------------------------------------------------------------------------


def _job_inputs(job) -> dict:
    return (job.spec or {}).get("inputs") or {}


def _lineage_links(inputs: dict) -> tuple[ModelVersion | None, Dataset | None]:
    parent = inputs.get("model") or {}
    data = inputs.get("data") or {}
    version = ModelVersion.objects.filter(pk=parent.get("id")).first() if parent.get("kind") == "version" else None
    dataset = Dataset.objects.filter(pk=data.get("id")).first() if data.get("id") else None
    return version, dataset


def _trained_task(job) -> str:
    """The task the job trained, as the worker ran it: the starting weights' own, else the spec's."""
    spec = job.spec or {}
    return (spec.get("resolved") or {}).get("task") or spec.get("task", "")


def model_name_of(task_name: str) -> str:
    """The registry name a job's task name gives its weights: one a spec can name (``model=NAME:v1``).

    Task names may hold spaces, ``+ @ ( )`` and non-ASCII letters; a model reference may not, so
    "portal ft" registered a version nobody could train, evaluate or export from by name (new-user
    trial 20). Each run of other characters becomes one ``-``.
    """
    ascii_name = unicodedata.normalize("NFKD", task_name).encode("ascii", "ignore").decode()
    return re.sub(r"[^A-Za-z0-9._-]+", "-", ascii_name).strip("-.") or "model"


def version_number_claim(*, team, name: str, task: str) -> int:
    """The next version number of model ``name`` for weights of ``task``: call it inside the
    transaction that creates the version. NameOfAnotherTask (nothing claimed once that transaction
    rolls back) when the name's versions are models of another task.

    This, not the submit check (apps.jobs.services.registry_task_errors), is what keeps a name's
    versions one task, so that ``name:latest`` never switches task: a detect and a classify
    training queued one after the other under a new name both pass that check, neither having
    registered yet. Every version — trained or uploaded — takes its number here, and
    ``version_next``'s update of the name's counter row holds that row (PostgreSQL: a row lock;
    SQLite: the write lock of the IMMEDIATE transaction) until the transaction ends; so two
    registrations of a name pass here one at a time, and the task read after the update sees
    every version committed before. Versions of unknown task (``task=""``: an upload whose head
    the scan could not read) neither set a name's task nor are refused by it.
    """
    latest = ModelVersion.objects.filter(team=team, name=name).aggregate(v=Max("version"))["v"]
    number = version_next(kind="model", team=team, name=name, floor=latest or 0)
    registered, versions = model_name_task(team=team, name=name)
    if task and registered and registered != task:
        raise NameOfAnotherTask(name=name, registered=registered, task=task, versions=versions)
    return number


def _registration_names(name: str, task: str):
    """``name``, then the names a training of ``task`` falls back to when ``name``'s versions are of
    another task: ``name-task``, then ``name-task-2`` … (all within the column's 200 characters)."""
    yield name
    if task:
        fallback = f"{name[:200 - len(task) - 4]}-{task}"
        yield fallback
        for n in range(2, 10):
            yield f"{fallback}-{n}"


def model_register(*, job, weights: Path, metrics: dict, code: dict | None = None, name: str = "",
                   lineage_extra: dict | None = None, key: str = "") -> ModelVersion:
    """Register a succeeded training job's weights as the next version of its task name (idempotent per job).

    The version records its lineage: the parent weights or version and the dataset version
    (both with their sha256, from what the job recorded at submit), the spec, the code
    versions the child reported. A sweep registers its best trial under the sweep's ``name``
    with ``lineage_extra`` = ``{"sweep": …}`` (apps.sweeps).

    A name whose versions are of another task (:func:`version_number_claim`; registered since
    the job's submit passed, by a job of another task queued under the same name or an upload)
    does not fail the job: its GPU time is spent and its weights are good. They are registered
    as ``NAME-TASK`` instead (``NAME-TASK-2`` … should that be another task's too), and the
    version's ``lineage["name_taken"]`` says which name it was meant for and why it is not;
    :func:`registration_note` words it for the job's outcome.

    ``key``: the weights' artifact key when ``weights`` is not the key's own file (a copy fetched
    from the artifact store into this machine's cache); by default the key of ``weights``.
    """
    existing = ModelVersion.objects.filter(job=job).first()
    if existing:
        return existing
    meant = model_name_of(name or job.task_name)
    task = _trained_task(job)
    inputs = _job_inputs(job)
    parent, dataset = _lineage_links(inputs)
    lineage = {"parent": inputs.get("model") or {}, "dataset": inputs.get("data") or {},
               "spec": job.public_spec, "code": code or {}, "job": str(job.pk), **(lineage_extra or {})}
    # Kept with the version: a val's class check must not depend on the dataset row surviving
    # (new-user trial 16, G17). Without a registered dataset, the checkpoint's own names.
    lineage["class_names"] = trained_class_names(lineage, dataset) or _checkpoint_class_names(weights)
    taken: NameOfAnotherTask | None = None
    for candidate in _registration_names(meant, task):
        for _ in range(5):
            try:
                with transaction.atomic():
                    version = version_number_claim(team=job.team, name=candidate, task=task)
                    if taken is not None:
                        lineage["name_taken"] = {"name": meant, "task": taken.registered,
                                                 "versions": taken.versions[:3]}
                    return ModelVersion.objects.create(
                        team=job.team, name=candidate, version=version, job=job,
                        source=ModelVersion.Source.TRAINING, filename=weights.name,
                        weights_key=key or artifact_key(weights), sha256=file_sha256(weights),
                        size=weights.stat().st_size, metrics=metrics, task=task,
                        parent=parent, dataset=dataset, lineage=lineage,
                    )
            except NameOfAnotherTask as exc:
                if candidate == meant:
                    taken = exc
                break
            except IntegrityError:
                continue  # another job of the same name registered at the same moment
    raise RuntimeError(f"could not register a model version for job {job.pk}")


def registration_note(version: ModelVersion) -> str:
    """Why ``version`` is not under the name its job meant (:func:`model_register`); "" when it is."""
    taken = (version.lineage or {}).get("name_taken")
    if not taken:
        return ""
    name = taken["name"]
    shown = ", ".join(taken.get("versions") or [])
    return (f"not as {name}: {name}'s versions are {taken['task']} models{f' ({shown})' if shown else ''} and a "
            f"name's versions are one task, so that {name}:latest never switches task; this {version.task} model "
            f"is {version.reference} (task_name {version.name} adds to it)")


def _checkpoint_class_names(weights: Path) -> list[str] | None:
    """The model's class names as the checkpoint scan reads them (nothing loaded); None when it cannot."""
    try:
        return scan_checkpoint(weights).class_names
    except (CheckpointRefused, OSError, ValueError):
        return None


# --- uploaded weights ---------------------------------------------------------------------------------


def _receive(upload: IO[bytes], *, limit: int) -> tuple[Path, str, int]:
    """Stream an upload into a hidden temp file of the models root: (path, sha256, size)."""
    import hashlib

    staging = root_path("models") / ".uploads"
    staging.mkdir(parents=True, exist_ok=True)
    path = staging / f"{uuid.uuid4().hex}.pt"
    digest, size = hashlib.sha256(), 0
    try:
        upload.seek(0)
        with open(path, "xb") as out:
            while chunk := upload.read(1 << 20):
                size += len(chunk)
                if size > limit:
                    raise WeightsRefused(f"the file is larger than the limit of {limit} bytes")
                digest.update(chunk)
                out.write(chunk)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path, digest.hexdigest(), size


def weights_check(path: Path) -> dict:
    """The checkpoint check as the upload sees it: WeightsRefused naming the offending global."""
    try:
        return scan_checkpoint(path).as_dict()
    except CheckpointRefused as exc:
        raise WeightsRefused(f"weights refused: {exc}", offending=exc.offending) from None


def weights_upload(*, user, team, upload: IO[bytes], filename: str, size: int, by=None,
                   filename_field: str = "file") -> tuple[ModelVersion, bool]:
    """Store uploaded weights as the next version of ``<stem>`` in the team's registry:
    ``(version, True)``; or ``(newest version, False)`` when that already holds these bytes
    under this file name (as a dataset push of unchanged files makes no version).

    1. A plain ``name.pt`` (WeightsRefused naming ``filename_field``: ``file``, or ``name``
       where the caller gave the name apart) and at most WEIGHTS_UPLOAD_MAX_BYTES.
    2. Received into a hidden temp file, hashed, and checked by the restricted unpickling
       pass (WeightsRefused naming the offending global) — never loaded.
    3. The same sha256 and file name as the newest upload of that name: stop here, nothing
       kept, nothing charged.
    4. Charged to the team's storage quota (StorageQuotaExceeded).
    5. In one transaction: the version number, the file moved to
       ``models/<team>/<stem>/v<N>/<file>``, the row; with an object store the file is then
       copied into it (:func:`_weights_store`); then audited, as done by ``by`` (the
       operator's command) or else ``user``.
    ``model=<file>`` in a spec then resolves to the newest such upload of the team.
    """
    if problem := member_name_problem(filename):
        raise WeightsRefused(problem, field=filename_field)
    limit = settings.WEIGHTS_UPLOAD_MAX_BYTES
    if size > limit:
        raise WeightsRefused(f"the file is {size} bytes; the limit is {limit} bytes")
    path, sha256, received = _receive(upload, limit=limit)
    charge = f"upload:{team.slug}:{path.stem}"
    try:
        scan = weights_check(path)
        name = key_part(filename[:-3])
        newest = ModelVersion.objects.filter(team=team, name=name).order_by("-version").first()
        if (newest is not None and newest.source == ModelVersion.Source.UPLOAD and newest.sha256 == sha256
                and newest.filename == filename):
            # A second push of the same file made v2 and charged it again (trial 16, G11).
            path.unlink(missing_ok=True)
            return newest, False
        storage_reserve(team=team, key=charge, size=received)
        with transaction.atomic():
            try:
                number = version_number_claim(team=team, name=name, task=scan["task"])
            except NameOfAnotherTask as exc:
                raise WeightsRefused(
                    f"{filename} holds a {exc.task} model, and {exc}: a name's versions are one task, so that "
                    f"{name}:latest never switches task. Upload it under another name (e.g. {name}-{exc.task}.pt)",
                    field=filename_field) from None
            key = key_join("models", team.slug, name, f"v{number}", filename)
            final = artifact_path(key)
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, final)
            version = ModelVersion.objects.create(
                team=team, name=name, version=number, source=ModelVersion.Source.UPLOAD, filename=filename,
                weights_key=key, sha256=sha256, size=received, task=scan["task"], uploaded_by=user,
                lineage={"uploaded": {"by": user.get_username() if user else "system", "file": filename,
                                      "scan": scan}},
            )
            storage_adjust(key=charge, size=received, new_key=key)
    except BaseException:
        path.unlink(missing_ok=True)
        storage_release(key=charge)
        raise
    _weights_store(version)
    audit_record(actor=by or user, action=AuditEntry.Action.WEIGHTS_UPLOAD, team=team, target=version,
                 message=f"weights {filename} uploaded as {version}", data={
                     "name": name, "version": number, "file": filename, "sha256": sha256, "bytes": received})
    return version, True


def _weights_store(version: ModelVersion) -> None:
    """Put uploaded weights into an object store before the upload answers (nothing to do on the
    shared filesystem); while it is unreachable (StorageUnavailable, a 503) the version goes again,
    file and charge with it, its number spent."""
    from apps.core.storage import artifact_upload, shared_filesystem

    if shared_filesystem():
        return
    final = artifact_path(version.weights_key)
    try:
        artifact_upload(version.weights_key, final)
    except BaseException:
        version.delete()
        storage_release(key=version.weights_key)
        final.unlink(missing_ok=True)
        raise


def shared_weights_add(*, source: Path, filename: str | None = None, by=None, replace: bool = False) -> SharedWeights:
    """Check ``source`` and copy it into the shared store as ``weights/<filename>`` (all teams' base weights).

    A different file under a name already shared needs ``replace`` (jobs record the sha256
    they used, so older jobs still say which bytes they trained from).
    """
    filename = filename or source.name
    if problem := member_name_problem(filename):
        raise WeightsRefused(problem)
    scan = weights_check(source)
    sha256 = file_sha256(source)
    key = key_join("weights", filename)
    final = artifact_path(key)
    current = SharedWeights.objects.filter(filename=filename).first()
    if (current or final.exists()) and not replace and (current is None or current.sha256 != sha256):
        raise WeightsRefused(f"shared weights {filename} already exist with other content: use --replace")
    if current is not None and current.sha256 == sha256 and final.exists():
        return current  # the same bytes again: nothing to store, nothing to audit
    from apps.core.storage import artifact_upload, shared_filesystem

    if not shared_filesystem():
        # Into the object store first (StorageUnavailable: nothing changed), so GPU servers and
        # web machines without this DATA_DIR find them (registry.selectors.weights_resolve).
        artifact_upload(key, source)
    final.parent.mkdir(parents=True, exist_ok=True)
    temp = final.with_name(f".{filename}.{uuid.uuid4().hex}")
    shutil.copyfile(source, temp)
    os.replace(temp, final)
    row, _ = SharedWeights.objects.update_or_create(filename=filename, defaults={
        "key": key, "sha256": sha256, "size": final.stat().st_size, "task": scan["task"], "scan": scan,
        "added_by": by if getattr(by, "is_authenticated", False) else None})
    # A replacement says so, with the bytes it replaced (it read "added", the old sha256 gone).
    replaced = {"replaced_sha256": current.sha256} if current is not None else {}
    audit_record(actor=by, action=AuditEntry.Action.WEIGHTS_SHARED_ADD, target=row,
                 message=f"shared weights {filename} {'replaced' if replaced else 'added'}",
                 data={"file": filename, "sha256": sha256, **replaced})
    return row


# --- stages -------------------------------------------------------------------------------------------

# none → staging → production → archived; archiving is always possible, an archived version may go
# back to staging. Promoting one version to production archives the one that held it.
STAGE_MOVES = {
    Stage.NONE: {Stage.STAGING, Stage.ARCHIVED},
    Stage.STAGING: {Stage.PRODUCTION, Stage.ARCHIVED, Stage.NONE},
    Stage.PRODUCTION: {Stage.ARCHIVED, Stage.STAGING},
    Stage.ARCHIVED: {Stage.STAGING},
}


class StageRefused(ValueError):
    pass


def model_stage_set(*, version: ModelVersion, stage: str, by) -> list[ModelVersion]:
    """Move ``version`` to ``stage`` (the caller checked that ``by`` manages the team); audited.

    Returns every version whose stage changed (the previous production version is archived).
    """
    if stage not in Stage.values:
        raise StageRefused(f"unknown stage {stage!r} (none, staging, production, archived)")
    if stage == version.stage:
        return []
    if stage not in STAGE_MOVES[Stage(version.stage)]:
        allowed = ", ".join(sorted(STAGE_MOVES[Stage(version.stage)]))
        where = "in no stage yet" if version.stage == "none" else f"in {version.stage}"  # "is in none" (trial 15, F9)
        raise StageRefused(f"{version.reference} is {where}; it can move to {allowed}")
    changed = []
    now = timezone.now()
    with transaction.atomic():
        if stage == Stage.PRODUCTION:
            for previous in ModelVersion.objects.select_for_update().filter(
                    team=version.team, name=version.name, stage=Stage.PRODUCTION).exclude(pk=version.pk):
                changed.append(_stage_write(previous, Stage.ARCHIVED, by, now, reason=f"{version.reference} promoted"))
        changed.append(_stage_write(version, stage, by, now))
    return changed


def _stage_write(version: ModelVersion, stage: str, by, now, reason: str = "") -> ModelVersion:
    before = version.stage
    ModelVersion.objects.filter(pk=version.pk).update(stage=stage, stage_changed_at=now)
    version.stage, version.stage_changed_at = stage, now
    audit_record(actor=by, action=AuditEntry.Action.MODEL_PROMOTE, team=version.team_id, target=version,
                 message=f"{version}: {before} → {stage}" + (f" ({reason})" if reason else ""),
                 data={"name": version.name, "version": version.version, "from": before, "to": stage})
    return version


# --- deletes --------------------------------------------------------------------------------------------


def model_version_delete(*, version: ModelVersion, by) -> None:
    """Delete a registered version (audited). Its number is not issued again; a trained version's
    weights stay with its job, an uploaded version's file and every export go (with their charge).
    Refused (``InUse``) while an active job starts from, evaluates or exports it."""
    ensure_deletable(version)
    target_id, label = str(version.pk), str(version)
    data = {"name": version.name, "version": version.version, "sha256": version.sha256,
            "job": str(version.job_id) if version.job_id else None, "source": version.source}
    owned = [version.weights_key] if version.source == ModelVersion.Source.UPLOAD else []
    owned += [e.key for e in version.exports.all()]
    version.delete()
    for key in owned:
        storage_release(key=key)
        artifact_path(key).unlink(missing_ok=True)
    from apps.core.storage import artifact_forget

    artifact_forget(owned)  # and out of an object store (nothing to do on the shared filesystem)
    audit_record(actor=by, action=AuditEntry.Action.MODEL_DELETE, team=version.team_id, target=version,
                 target_id=target_id, message=f"model {label} deleted", data=data)


# --- results of val, predict and export jobs -------------------------------------------------------------


def evaluation_record(*, job, version: ModelVersion | None, finished: dict) -> Evaluation:
    """A val job's metrics; ``version`` None for weights that are no registered version (the
    job's ``inputs.model`` names them)."""
    inputs = _job_inputs(job)
    data = inputs.get("data") or {}
    evaluation, _ = Evaluation.objects.update_or_create(job=job, defaults={
        "version": version, "model_lineage": inputs.get("model") or {}, "dataset": Dataset.objects.filter(pk=data.get("id")).first() if data.get("id") else None,
        "dataset_lineage": data, "split": finished.get("split") or "val",
        "metrics": finished.get("metrics") or {}, "per_class": finished.get("per_class") or [],
        "speed": finished.get("speed") or {}})
    return evaluation


def export_record(*, job, version: ModelVersion | None, exported: dict) -> Export:
    """Move an exported file into the version's registry folder and record it with its verification.

    Weights that are no registered version (``version`` None: shared base weights, a team file)
    have no registry folder: their export keeps its file in the job's folder, as below.

    With an object store (GPU servers without the shared DATA_DIR) the export keeps the key of
    its file in the job's folder: the worker stored that folder before the success that calls
    this was recorded (worker.artifacts.results_upload), and this runs inside that record's
    transaction, where no network I/O belongs. A copy into this node's own models/ folder would
    be on no other machine: the web's download answered 404.
    """
    from apps.core.storage import shared_filesystem

    source = Path(exported["path"])
    if version is None or not shared_filesystem():
        return Export.objects.create(version=version, job=job, format=exported["format"],
                                     model_lineage=(_job_inputs(job).get("model") or {}) if version is None else {},
                                     options=exported.get("options") or {}, key=artifact_key(source),
                                     sha256=file_sha256(source), size=source.stat().st_size,
                                     verification=exported.get("verification") or {})
    key = key_join("models", version.team.slug, key_part(version.name), f"v{version.version}", "exports",
                   str(job.pk), source.name)
    final = artifact_path(key)
    final.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, final)
    return Export.objects.create(version=version, job=job, format=exported["format"],
                                 options=exported.get("options") or {}, key=key, sha256=file_sha256(final),
                                 size=final.stat().st_size, verification=exported.get("verification") or {})


def prediction_record(*, job, version: ModelVersion | None, finished: dict) -> PredictionRun:
    inputs = _job_inputs(job)
    run, _ = PredictionRun.objects.update_or_create(job=job, defaults={
        "version": version, "source": inputs.get("source") or {}, "key": artifact_key(Path(finished["folder"])),
        "images": int(finished.get("images") or 0), "boxes": int(finished.get("boxes") or 0)})
    return run


def _weights_name(inputs: dict) -> str:
    model = inputs.get("model") or {}
    return f"{model.get('name') or 'the weights'}{' (shared)' if model.get('kind') == 'shared' else ''}"


def job_outputs_record(*, job, finished: dict) -> str:
    """Record what a succeeded job produced, by its mode; returns a few words for its event.

    train: weights → a new version (+ the exports ``export: [onnx]`` made after training);
    val: an Evaluation; predict: a PredictionRun; export: Export rows of the version.
    """
    mode = (job.spec or {}).get("mode", "train")
    inputs = _job_inputs(job)
    target = ModelVersion.objects.filter(pk=(inputs.get("model") or {}).get("id")).first() \
        if (inputs.get("model") or {}).get("kind") == "version" else None
    words = []
    if mode == "train":
        weights = Path(finished.get("weights") or "")
        if not weights.is_file():
            return "finished; no weights file was written"
        if getattr(job, "parent_id", None):  # a sweep's trial: the sweep registers its best one
            return f"finished; weights at {weights.name} (a sweep trial: its sweep registers the best trial's)"
        target = model_register(job=job, weights=weights, metrics=finished.get("metrics") or {},
                                code=finished.get("code"))
        note = registration_note(target)
        words.append(f"weights at {weights.name}, registered as {target}" + (f" ({note})" if note else ""))
    elif mode == "val":
        evaluation = evaluation_record(job=job, version=target, finished=finished)
        words.append(f"evaluation of {target or _weights_name(inputs)} on {evaluation.split} stored")
    elif mode == "predict":
        run = prediction_record(job=job, version=target, finished=finished)
        words.append(f"{run.images} images annotated, {run.boxes} boxes")
    for exported in finished.get("exports") or []:
        if exported.get("path") and not exported.get("error"):
            export = export_record(job=job, version=target, exported=exported)
            verification = export.verification
            words.append(f"{export.format} export verified (max abs diff {verification.get('max_abs', 0):.2e})")
    return "finished; " + "; ".join(words) if words else "finished"
