"""Continue an ended training job from its newest stored checkpoint, as a new job.

A job that failed, was cancelled or timed out keeps its resume checkpoints in the artifact
store (``CHECKPOINT_RETENTION_DAYS``, apps/jobs/checkpoint_retention.py). Continuing it
submits its spec again (``job_submit``: the same checks, duplicate refusal, throttle and
active-job cap as any submit; optionally a new ``timeout``) as a new job whose first attempt
resumes that checkpoint exactly as a requeued attempt resumes its own (worker/tasks.py
``AttemptRunner.train``): the new job gets its own Checkpoint row for it, so it trains only
the epochs left.

The bytes are copied, not referenced: the copy lives under the new job's own
``jobs/<id>/checkpoints/`` key (the file the worker looks for in the new run folder on a
shared filesystem, the object it fetches otherwise), so the old job's retention or deletion
cannot take it away, and the new job's own retention removes it like its other checkpoints.
The checkpoint Ultralytics also wrote as best.pt is copied too (when it is an older epoch),
so the continued run's best.pt is the better of the two runs' (``best_restore``).

What the weights went through comes along: the new job trains on the dataset version the old
one did (``data=name`` is pinned to ``name:vN``, not re-resolved to the newest version), and
its metrics begin with the old job's points of epochs 1..N (copied as ``attempt`` 0, so the
curves are whole and the runtime estimate, which reads the current attempt's points, measures
only the epochs the new job trains).

Steps of :func:`job_continue`:

1. refuse what cannot continue (:func:`continue_point`): not a training job, still active,
   succeeded, continued already by a job that has ended (continue that one), no stored
   checkpoint, or a checkpoint of the final epoch;
2. rebuild the spec from the job's own text (as Resubmit does), with the new ``timeout``,
   the job's own team (:func:`team_pinned`), ``data`` naming the version the job trained on
   and ``model`` the registered version it started from (refused when either version was
   deleted: the worker needs both);
3. copy the checkpoint(s) under a job id chosen now, then, in one transaction, submit the
   job with that id, record the copies as its checkpoints (the scheduler cannot place it
   before they are there) and copy its metric points of the epochs it continues; anything
   refused removes the copies again.
"""

from __future__ import annotations

import json
import logging
import shlex
import uuid
from dataclasses import dataclass

import yaml
from django.db import transaction
from django.db.models import OuterRef, Subquery

from apps.core.errors import FieldErrors
from apps.core.storage import ArtifactChanged, StorageUnavailable, artifact_copy, artifact_delete, artifact_save_bytes
from apps.core.strict_yaml import load_yaml

from .models import ACTIVE_STATES, TERMINAL_STATES, Checkpoint, Job, JobState, MetricPoint
from .services import job_event, job_submit, seq_allocate, spec_parse
from .spec import SpecError, parse_memory_mb

log = logging.getLogger(__name__)

# Ultralytics' own default when a spec gives no epochs.
DEFAULT_EPOCHS = 100

# The ``attempt`` of a metric point the new job carries over from the job it continues.
INHERITED_ATTEMPT = 0


class ContinueRefused(FieldErrors):
    """The job cannot be continued; ``status`` is the HTTP status the API answers (400 or 409)."""

    def __init__(self, field: str, message: str, status: int = 409):
        super().__init__({field: message})
        self.status = status


@dataclass(frozen=True)
class ContinuePoint:
    """Where a continuation starts: the newest stored checkpoint (its ``epoch``) of ``epochs``."""

    checkpoint: Checkpoint
    best: Checkpoint | None  # the older checkpoint that is the run's best.pt, if any
    epochs: int

    @property
    def epoch(self) -> int:
        return self.checkpoint.epoch


def spec_epochs(job: Job) -> int:
    return int((job.spec.get("train_args") or {}).get("epochs") or DEFAULT_EPOCHS)


def continue_point(job: Job, *, user=None, idempotency_key: str = "") -> ContinuePoint:
    """The checkpoint ``job`` would continue from; ContinueRefused saying why there is none.

    ``user`` and ``idempotency_key`` are the caller's: a replay of the request that made a
    continuation is answered with that job by ``job_submit``, even once it has ended.
    """
    mode = (job.spec or {}).get("mode") or "train"
    if job.is_sweep:
        raise ContinueRefused("mode", "the job is a sweep, which trains nothing itself: continue one of its trials", 400)
    if mode != "train":
        raise ContinueRefused("mode", f"the job is a {mode} job: only a training job can be continued", 400)
    if job.state in ACTIVE_STATES:
        raise ContinueRefused("state", f"job is {job.state}; only an ended job (failed, cancelled or timed out) "
                                       "can be continued")
    if job.state == JobState.SUCCEEDED:
        # How to train on from here (new-user trial 20: "use its weights" left the how to the user).
        version = getattr(job, "model_version", None)
        how = f" (a new training job with model={version.reference} starts from them)" if version else ""
        raise ContinueRefused("state", f"job succeeded: nothing left to train; use its weights{how}")
    _refuse_continued(job, user=user, idempotency_key=idempotency_key)
    stored = job.checkpoints.exclude(key="")
    newest = stored.order_by("-epoch").first()
    if newest is None:
        why = ("it never started" if job.first_started_at is None else
               "it ended before its first epoch did" if not job.epochs_done else
               "none of its checkpoints is kept in the artifact store (they leave it CHECKPOINT_RETENTION_DAYS "
               "after the job ended, or stayed on the server that ran it)")
        raise ContinueRefused("checkpoint", f"the job has no stored checkpoint to continue from: {why}")
    epochs = spec_epochs(job)
    if newest.epoch >= epochs:
        raise ContinueRefused("checkpoint", f"its checkpoint is of epoch {newest.epoch}, the last of {epochs}: "
                                            "nothing left to train; use its weights")
    best = None if newest.best else stored.filter(best=True, epoch__lt=newest.epoch).order_by("-epoch").first()
    return ContinuePoint(checkpoint=newest, best=best, epochs=epochs)


ENDED_AS = {JobState.CANCELLED: "was cancelled", JobState.TIMED_OUT: "timed out", JobState.FAILED: "failed"}


def _refuse_continued(job: Job, *, user, idempotency_key: str) -> None:
    """ContinueRefused when a continuation of ``job`` has ended: its epochs are trained from there.

    Continuing the same job again trained the epochs its continuation had already trained (a
    succeeded continuation's page said "nothing left to train" while the old job's page still
    offered "Continue from epoch N": new-user trial 23). A failed, cancelled or timed-out
    continuation holds a checkpoint at least as new, so that is the one to continue. An active
    continuation is left to ``job_submit``: a duplicate naming it, or an idempotent replay.
    """
    # Submitted after the job ended: the team's jobs since then (job_team_recent), not all of them
    # read for their spec (the job page asks this of every ended training).
    since = job.finished_at or job.created_at
    later = (Job.objects.filter(team_id=job.team_id, created_at__gte=since, spec__continued_from__job=str(job.pk),
                                state__in=TERMINAL_STATES)
             .select_related("model_version").order_by("-created_at").first())
    if later is None:
        return
    if idempotency_key and later.user_id == getattr(user, "pk", None) and later.idempotency_key == idempotency_key:
        return
    if later.state == JobState.SUCCEEDED:
        version = getattr(later, "model_version", None)
        how = f" (a new training job with model={version.reference} starts from them)" if version else ""
        raise ContinueRefused("state", f"job was continued as job {later.pk}, which succeeded: nothing left to train; "
                                       f"use its weights{how}")
    raise ContinueRefused("state", f"job was continued as job {later.pk}, which {ENDED_AS[later.state]}: continue "
                                   "that one (it resumes from the same checkpoint or a newer one)")


def continued_by(job: Job) -> Job | None:
    """For pages: the newest job submitted to continue ``job`` (any state), or None.

    The old job's page offered no word of it: "Continue" was gone once the continuation had
    ended, and while it ran the button was there and its click a duplicate refusal (trial25 F3).
    """
    since = job.finished_at or job.created_at
    return (Job.objects.filter(team_id=job.team_id, created_at__gte=since, spec__continued_from__job=str(job.pk))
            .only("id", "task_name", "state", "epochs_done").order_by("-created_at").first())


def continue_available(job: Job, gone: frozenset[str] | None = None) -> ContinuePoint | None:
    """For pages: the point a "Continue from epoch N" button would start from, or None (also when
    the dataset or model version the job used has been deleted since: the button's click was then
    a refusal, trial25; the page names the deleted input). ``gone``: :func:`inputs_gone`, when the
    caller has it already."""
    if inputs_gone(job) if gone is None else gone:
        return None
    try:
        return continue_point(job)
    except ContinueRefused:
        return None


def inputs_gone(job: Job) -> frozenset[str]:
    """Which of the registered inputs ``job`` used ("data", "model") have been deleted since: a page
    names them instead of linking a 404, and offers no Continue (its click would be a refusal)."""
    gone = set()
    for field, kept in (("data", _data_kept), ("model", _model_kept)):
        try:
            kept(job)
        except ContinueRefused:
            gone.add(field)
    return frozenset(gone)


def _document(job: Job, timeout_s: int | None, memory: str | None = None,
              gpus: float | None = None, val: bool | None = None) -> tuple[dict, str]:
    """The job's spec document (its stored text, as Resubmit reads it) with the new ``timeout``,
    the new ``resources.memory`` ("" removes it), the new ``resources.gpu``, the new ``val``
    argument and its data pinned (:func:`_data_pinned`), and the text to store (the old text
    when none changed it)."""
    try:
        document = load_yaml(job.raw_spec, max_bytes=1 << 20) if job.raw_spec else None
    except FieldErrors as exc:
        raise ContinueRefused("spec", f"the original spec text cannot be read: {exc}") from None
    if not isinstance(document, dict):
        raise ContinueRefused("spec", "the original spec text is missing; use Edit & resubmit")
    changed = team_pinned(job, _model_pinned(job, _data_pinned(job, document)))
    if timeout_s is not None:
        changed = {**changed, "timeout": timeout_s}
    if memory is not None:
        resources = changed.get("resources")
        resources = {**(resources if isinstance(resources, dict) else {}), "memory": memory}
        if memory == "":  # the portal's box emptied: no memory limit of its own
            del resources["memory"]
        changed = {**changed, "resources": resources}
    if gpus is not None:
        resources = changed.get("resources")
        resources = {**(resources if isinstance(resources, dict) else {}), "gpu": int(gpus) if gpus >= 1 else gpus}
        changed = {**changed, "resources": resources}
    if val is not None:
        changed = _arg_set(changed, "val", val)
    if changed == document:
        return document, job.raw_spec
    # YAML, as the spec was most likely written: Edit & resubmit shows this text in the YAML box.
    return changed, yaml.safe_dump(changed, sort_keys=False, allow_unicode=True)


def spec_memory(job: Job) -> str:
    """The memory the job's spec text asked for, as written ("300Mi"), or "" (none given)."""
    try:
        document = load_yaml(job.raw_spec, max_bytes=1 << 20) if job.raw_spec else None
    except FieldErrors:
        return ""
    resources = document.get("resources") if isinstance(document, dict) else None
    value = resources.get("memory") if isinstance(resources, dict) else None
    return "" if value is None else str(value)


def team_pinned(job: Job, document: dict) -> dict:
    """``document`` charged to ``job``'s own team by its slug (under the key it used, else ``team``).

    A spec that names no team, or its submitter's username (``user: bob``), is charged to the
    submitter's team (a member of several must name one: trial26; before, the first by name).
    Sent again by someone else, the same text meant *their* first team:
    a member of two teams continued one team's job into the other, checkpoint, curves and
    lineage included (sec19, F1), and a teammate got "not a member of a team named 'bob'".
    A continuation or a Resubmit is the job's again, so it stays in the job's team.
    """
    key = "team" if "team" in document else "user" if "user" in document else "team"
    if document.get(key) == job.team.slug:
        return document
    return {**document, key: job.team.slug}


def _data_pinned(job: Job, document: dict) -> dict:
    """``document`` with its ``data`` naming the registered dataset version ``job`` trained on.

    ``data=demo`` means the newest version when submitted; a continuation must train on the
    version the epochs it continues saw, whatever was uploaded since, so it says ``demo:v1``.
    A data folder that is no registered version has nothing to pin and is left as it is.
    ContinueRefused (``data``) when that version has been deleted.
    """
    used = _data_kept(job)
    return document if used is None else _pin(document, "data", f"{used[0]}:v{used[1]}")


def _data_kept(job: Job) -> tuple[str, int] | None:
    """(name, version) of the registered dataset version ``job`` trained on, None for a folder
    that is no version; ContinueRefused (``data``) when that version has been deleted."""
    from apps.datasets.selectors import dataset_version_get

    used = ((job.spec or {}).get("inputs") or {}).get("data") or {}
    if not used.get("id"):
        return None
    name, version = used["name"], used["version"]
    if dataset_version_get(team=job.team, name=name, version=version) is None:
        raise ContinueRefused("data", f"the job trained on dataset {name} v{version}, which has been deleted since: "
                                      "a continuation trains on the same data as the epochs it continues (to train "
                                      "on another version, use Edit & resubmit: a new training)")
    return name, version


def _model_pinned(job: Job, document: dict) -> dict:
    """``document`` with its ``model`` naming the registered model version ``job`` started from
    (``name:latest`` or ``name:production`` pinned to ``name:vN``): the lineage names the version
    the continued epochs came from, whatever was registered or promoted since. Weights that are no
    registered version (a model YAML, shared or team files) are left as they are.

    ContinueRefused (``model``) when that version has been deleted: the resume loads the
    checkpoint, not the model, but the worker still needs the model's weights for the attempt
    (worker/tasks.py ``AttemptRunner``: ``stage_inputs`` fetches them on a node without the
    shared filesystem, and ``train`` falls back to starting over from them when the checkpoint
    cannot be loaded), and an uploaded version's file goes with its row.
    """
    used = _model_kept(job)
    return document if used is None else _pin(document, "model", f"{used[0]}:v{used[1]}")


def _model_kept(job: Job) -> tuple[str, int] | None:
    """(name, version) of the registered model version ``job`` started from, None for weights
    that are no version; ContinueRefused (``model``) when that version has been deleted."""
    from apps.registry.models import ModelVersion

    used = ((job.spec or {}).get("inputs") or {}).get("model") or {}
    if used.get("kind") != "version" or not used.get("id"):
        return None
    name, number = used["name"], used["version"]
    version = ModelVersion.objects.filter(pk=used["id"], team=job.team_id).first()
    if version is None or not version.weights_key:
        raise ContinueRefused("model", f"the job started from model {name} v{number}, which has been deleted since: "
                                       "a continuation needs its weights too (its worker fetches them, and starts "
                                       "over from them if the checkpoint cannot be loaded); to train from another "
                                       "model, use Edit & resubmit: a new training")
    return name, number


def _pin(document: dict, key: str, pinned: str) -> dict:
    """``document`` with ``key`` (data or model) saying ``pinned``, in its ``command`` string or its
    structured ``train`` block; the same document when it already does."""
    if isinstance(document.get("command"), str):
        words = shlex.split(document["command"])  # it parsed when the job was submitted
        if all(word == f"{key}={pinned}" for word in words if word.startswith(f"{key}=")):
            return document
        words = [f"{key}={pinned}" if word.startswith(f"{key}=") else word for word in words]
        return {**document, "command": shlex.join(words)}
    if isinstance(document.get("train"), dict) and document["train"].get(key) not in (None, pinned):
        return {**document, "train": {**document["train"], key: pinned}}
    return document


def _arg_set(document: dict, key: str, value: bool) -> dict:
    """``document`` with the training argument ``key`` set to ``value``: in its ``command`` string
    (``key=False``, in place of any ``key=…`` or bare ``key`` word, else added) or its ``train`` block."""
    if isinstance(document.get("command"), str):
        words = shlex.split(document["command"])  # it parsed when the job was submitted
        kept = [word for word in words if word != key and not word.startswith(f"{key}=")]
        return {**document, "command": shlex.join([*kept, f"{key}={value}"])}
    if isinstance(document.get("train"), dict):
        return {**document, "train": {**document["train"], key: value}}
    return document


def _metrics_carry(job: Job, new: Job, epoch: int) -> None:
    """Copy ``job``'s metric points of epochs 1..``epoch`` (what the resumed weights went through)
    to ``new``, with sequence numbers of the new job's and the times they were measured.

    Called in the transaction that inserts ``new``: nobody can watch it yet, so nothing is
    published; its worker's points (epoch + 1 on) come after these in ``seq``.
    """
    points = list(MetricPoint.objects.filter(job=job, epoch__lte=epoch).order_by("epoch"))
    if not points:
        return
    first = seq_allocate(new.pk, len(points))
    MetricPoint.objects.bulk_create([
        MetricPoint(job=new, epoch=point.epoch, attempt=INHERITED_ATTEMPT, seq=first + n, values=point.values)
        for n, point in enumerate(points)])
    # created_at is stamped at insert (auto_now_add): give each copy its original's time.
    MetricPoint.objects.filter(job=new, attempt=INHERITED_ATTEMPT).update(created_at=Subquery(
        MetricPoint.objects.filter(job=job, epoch=OuterRef("epoch")).values("created_at")[:1]))
    new.seq = first + len(points) - 1


def _copy(job: Job, new_id: uuid.UUID, checkpoint: Checkpoint) -> tuple[str, list[str]]:
    """Copy ``checkpoint`` (and its sidecar) under the new job's keys; (its key, every key written)."""
    key = f"jobs/{new_id}/checkpoints/epoch-{checkpoint.epoch:04d}.pt"
    try:
        artifact_copy(checkpoint.key, key, sha256=checkpoint.sha256)
    except (FileNotFoundError, ArtifactChanged) as exc:
        raise ContinueRefused("checkpoint", f"the stored checkpoint of epoch {checkpoint.epoch} cannot be used: "
                                            f"{exc}") from None
    sidecar = key[:-3] + ".json"  # what the training child checks the file against (worker/train_child.py)
    artifact_save_bytes(sidecar, json.dumps({"epoch": checkpoint.epoch, "sha256": checkpoint.sha256,
                                             "size": checkpoint.size}).encode())
    return key, [key, sidecar]


def job_continue(*, job: Job, user, timeout_s: int | None = None, memory: str | None = None,
                 gpus: float | None = None, val: bool | None = None, idempotency_key: str = "") -> tuple[Job, bool]:
    """A new job that resumes ``job``'s newest stored checkpoint; (job, created) as ``job_submit``.

    ``memory`` (a quantity such as ``16Gi``) replaces the spec's ``resources.memory``: a job that
    ran out of memory is continued with more, not into the same out-of-memory; a bad one is a
    SpecError under ``memory``. ``gpus`` (parsed by ``parse_gpus``) replaces ``resources.gpu``: a
    job over a per-job GPU limit lowered since its submit is continued with fewer (trial31); the
    worker forces the device on a resume, so the checkpoint resumes on any count. Its refusals
    (the limits) are under ``gpu``. ``val`` sets the training's ``val`` argument: a training on a
    dataset whose val split has no labels is refused unless val=false (inputs._train_val_check),
    and one submitted before that refusal existed could otherwise not be continued (left32);
    Ultralytics lets a resume change ``val`` (``BaseTrainer.check_resume``'s allowed overrides).

    Raises ContinueRefused, SpecError (the spec no longer passes a submit: deleted weights, a data
    folder gone, a timeout over the limit), DuplicateJob, TooManyActiveJobs, IdempotencyKeyReused,
    StorageUnavailable.
    """
    if memory:  # the request's own field before the job's state (trial27 F11); "" removes the limit
        try:
            parse_memory_mb(memory)
        except ValueError as exc:
            raise SpecError({"memory": str(exc)}) from None
    point = continue_point(job, user=user, idempotency_key=idempotency_key)
    document, raw_spec = _document(job, timeout_s, memory, gpus, val)
    try:
        spec = spec_parse(document, user=user)  # SpecError before anything is copied
    except SpecError as exc:
        raise _named(exc, memory, gpus, val) from None
    new_id = uuid.uuid4()
    lineage = {"job": str(job.pk), "task_name": job.task_name, "epoch": point.epoch}
    written: list[str] = []
    # A replay (the key made a job already): job_submit answers with that job or refuses the
    # key; copying the checkpoints first only to delete them again cost a checkpoint's bytes
    # twice per retry (and a store that hiccupped turned a replay into a 409).
    replay = bool(idempotency_key) and Job.objects.filter(user=user, idempotency_key=idempotency_key).exists()
    try:
        copies = []
        for checkpoint in filter(None, () if replay else (point.checkpoint, point.best)):
            key, keys = _copy(job, new_id, checkpoint)
            written += keys
            copies.append((checkpoint, key))
        with transaction.atomic():
            try:
                new, created = job_submit(user=user, spec=spec, raw_spec=raw_spec, idempotency_key=idempotency_key,
                                          job_id=new_id, continued_from=lineage)
            except SpecError as exc:  # the limits (resources.gpu's per-job limit) are checked here
                raise _named(exc, memory, gpus, val) from None
            if created:
                from apps.core.artifacts import artifact_path

                if replay:  # the key's job was deleted meanwhile: not a continuation without its checkpoint
                    raise ContinueRefused("checkpoint", "the job this Idempotency-Key made is gone; send again")
                for checkpoint, key in copies:
                    Checkpoint.objects.create(job=new, attempt=new.attempt, epoch=checkpoint.epoch,
                                              path=str(artifact_path(key)), sha256=checkpoint.sha256,
                                              size=checkpoint.size, key=key, best=checkpoint.best)
                Job.objects.filter(pk=new.pk).update(epochs_done=point.epoch)
                new.epochs_done = point.epoch
                _metrics_carry(job, new, point.epoch)
                job_event(job, "continued", f"continued by {user.username} as job {new.pk} from its checkpoint "
                                            f"of epoch {point.epoch}", {"job": str(new.pk), "epoch": point.epoch})
    except BaseException:
        _forget(written)
        raise
    if not created:  # an Idempotency-Key replay: that job has its own copies
        _forget(written)
    return new, created


# The end of inputs._train_val_check's refusal (an unlabelled val split), said the same on a continue.
VAL_FALSE_ADVICE = "or train with val=false"


def _named(exc: SpecError, memory: str | None, gpus: float | None, val: bool | None = None) -> SpecError:
    """The spec's refusal under the request's field where the caller gave one (``memory``, ``gpu``);
    a GPU limit the job's own count is over says how to continue with fewer, an unlabelled val
    split how to continue without validation."""
    errors = dict(exc.errors)
    if val is None:
        for field in ("command.data", "train.data"):
            if VAL_FALSE_ADVICE in str(errors.get(field, "")):
                errors[field] = (f"{errors[field]} (continue with val=false: val in the API, yoloq continue "
                                 "--no-val, or untick Validate on the job page)")
    if memory is not None and "resources.memory" in errors:
        errors["memory"] = errors.pop("resources.memory")
    if gpus is not None and "resources.gpu" in errors:
        errors["gpu"] = errors.pop("resources.gpu")
    elif "limit" in str(errors.get("resources.gpu", "")) or "at most" in str(errors.get("resources.gpu", "")):
        errors["resources.gpu"] = f"{errors['resources.gpu']} (continue with fewer: gpu, yoloq continue --gpus N)"
    return SpecError(errors)


def _forget(keys: list[str]) -> None:
    for key in keys:
        try:
            artifact_delete(key)
        except (StorageUnavailable, OSError) as exc:  # the orphan goes with the job's retention
            log.warning("continue: could not remove the copied %s: %s", key, exc)


__all__ = ["ContinuePoint", "ContinueRefused", "SpecError", "continue_available", "continue_point", "inputs_gone", "job_continue",
           "spec_memory", "team_pinned"]
