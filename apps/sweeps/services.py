"""The sweep step: a step of the scheduler loop that drives every running sweep.

Where it runs, and why there (docs/sweeps.md): :func:`sweeps_advance` is called by
``apps.scheduling.loop.tick`` on every pass, before planning, so trials it submits are
placed in the same pass. The scheduler already runs exactly when a sweep has something to
do — it is kicked when a trial finishes and (``jobs.services.metrics_record``) when a trial
reports an epoch — and at least every ``SCHEDULER_TICK_S``; it is one process (the leader),
restarted by its supervisor. Everything the step knows is in the database (the parent's
spec, the :class:`~apps.sweeps.models.Trial` rows, the trials' jobs and metric points), and
every write is conditional or keyed:

- a trial is inserted with its job in one transaction, under the unique ``(sweep, number)``
  (and the job under the idempotency key ``sweep:<id>:<number>``): a step that dies
  half-way leaves nothing, one that runs again or races another creates nothing twice;
- pruning writes the decision and the cancel in one transaction; a cancel is conditional;
- the parent ends through a conditional transition, with its best version registered in
  the same transaction.

So a scheduler (or web) restart mid-sweep loses no trial and duplicates none; the next
pass carries on. An RQ task per trial event would need this same repair pass anyway (a
lost task would stall the sweep), so there is one mechanism instead of two.

Trials are ordinary train jobs of the sweep's owner: the policy, the quotas, the
preemption and the fair share see nothing else. A sweep holds at most ``parallel`` of
them queued or running at once, and never more than its owner's fair share gives.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import yaml
from django.db import IntegrityError, transaction
from django.db.models import Q

from apps.core.artifacts import artifact_path
from apps.core.storage import ArtifactChanged, StorageUnavailable, artifact_local, shared_filesystem
from apps.jobs.models import ACTIVE_STATES, Job, JobEvent, JobState, MetricPoint
from apps.jobs.services import DuplicateJob, TooManyActiveJobs, job_cancel, job_event, job_submit, sweep_finish
from apps.jobs.spec import SpecError, parse_spec
from apps.registry.services import model_register, registration_note

from .models import Trial
from .search import COMPLETE, FAILED, PRUNED, RUNNING, TrialRecord, propose, prune_decide, trials_to_create
from .selectors import best_pick

log = logging.getLogger(__name__)
FAILED_STATES = (JobState.FAILED, JobState.TIMED_OUT)


def sweeps_advance(now=None) -> bool:
    """One pass over every running sweep; True if anything was written ("did work?").

    A sweep whose step raises is logged and left for the next pass: it never stops the
    scheduler from placing jobs.
    """
    did = False
    for parent in Job.objects.filter(is_sweep=True, state=JobState.RUNNING).select_related("team", "user"):
        try:
            did |= sweep_advance(parent)
        except Exception:  # noqa: BLE001 - one sweep's bug must not stop the scheduler
            log.exception("sweep %s: its step failed; retrying on the next pass", parent.pk,
                          extra={"job_id": str(parent.pk)})
    did |= orphans_cancel()
    return did


def sweep_advance(parent: Job) -> bool:
    """1. Record what the trials reported (new epochs, how finished ones ended).
    2. Judge each new epoch of each active trial with the pruner; cancel the trials it stops.
    3. Submit trials while fewer than ``parallel`` are queued or running, up to ``trials``.
    4. When every trial has ended, end the sweep: succeeded (its best trial's weights
       registered as a model version) unless every trial failed.
    """
    config = parent.spec["sweep"]
    trials = list(Trial.objects.filter(sweep=parent).select_related("job").order_by("number"))
    did = trials_observe(config, trials)
    if config.get("prune"):
        did |= trials_prune(config, trials)
    did |= trials_submit(parent, config, trials)
    did |= sweep_complete(parent, config, trials)
    return did


# --- 1. observe ---------------------------------------------------------------------------------


def trials_observe(config: dict, trials: list[Trial]) -> bool:
    did = False
    metric = config["metric"]
    for trial in trials:
        job = trial.job
        if job is None or trial.recorded:
            continue
        known = max((int(e) for e in trial.intermediate), default=0)
        changed = []
        if job.epochs_done > known:
            for epoch, values in MetricPoint.objects.filter(job=job, epoch__gt=known).values_list("epoch", "values"):
                value = (values or {}).get(metric)
                if _number(value):
                    trial.intermediate[str(epoch)] = float(value)
            changed.append("intermediate")
        if job.state not in ACTIVE_STATES:
            trial.recorded = True
            trial.value = trial_value(trial, metric) if job.state == JobState.SUCCEEDED and not trial.pruned else None
            changed += ["recorded", "value"]
        if changed:
            trial.save(update_fields=changed)
            did = True
    return did


def trial_value(trial: Trial, metric: str) -> float | None:
    """A succeeded trial's metric: the final validation of its best weights (what the sweep
    would register), else the best epoch it reported."""
    finished = JobEvent.objects.filter(job=trial.job, kind="succeeded").order_by("-seq").first()
    final = ((finished.data or {}).get("metrics") or {}).get(metric) if finished else None
    if _number(final):
        return float(final)
    values = [v for v in trial.intermediate.values() if _number(v)]
    return max(values) if values else None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def record_of(trial: Trial) -> TrialRecord:
    job = trial.job
    if job is None:
        state = FAILED
    elif trial.pruned:
        state = PRUNED
    elif job.state in ACTIVE_STATES:
        state = RUNNING
    elif job.state == JobState.SUCCEEDED and trial.value is not None:
        state = COMPLETE
    else:
        state = FAILED
    return TrialRecord(number=trial.number, params=trial.params, state=state, value=trial.value,
                       intermediate={int(e): v for e, v in trial.intermediate.items()},
                       system_attrs=trial.system_attrs)


# --- 2. prune -------------------------------------------------------------------------------------


def trials_prune(config: dict, trials: list[Trial]) -> bool:
    """Judge each epoch a trial reported since the last pass, in order, as Optuna's
    ``report`` + ``should_prune`` would have after that epoch. The final epoch is never
    judged: the trial has done its work by then."""
    did = False
    for trial in trials:
        job = trial.job
        if job is None or trial.pruned or job.state not in ACTIVE_STATES or job.cancel_requested_at:
            continue
        total = int((job.spec.get("train_args") or {}).get("epochs") or 0)
        judged = False
        for epoch in sorted(int(e) for e in trial.intermediate if int(e) > trial.checked_epoch):
            trial.checked_epoch = epoch
            judged = did = True
            if total and epoch >= total:
                continue
            decision = prune_decide(config, [record_of(t) for t in trials], record_of(trial), epoch)
            trial.system_attrs = decision.system_attrs
            if decision.prune:
                trial.pruned_epoch, trial.note = epoch, decision.message[:500]
                with transaction.atomic():
                    trial.save(update_fields=["checked_epoch", "system_attrs", "pruned_epoch", "note"])
                    job_cancel(job=job, by=None, reason=decision.message)
                log.info("sweep %s: trial %d %s", trial.sweep_id, trial.number, decision.message,
                         extra={"job_id": str(job.pk)})
                break
        else:
            if judged:
                trial.save(update_fields=["checked_epoch", "system_attrs"])
    return did


# --- 3. submit ------------------------------------------------------------------------------------


def trials_submit(parent: Job, config: dict, trials: list[Trial]) -> bool:
    """Submit trials while fewer than ``parallel`` are active (a trial that could not be
    submitted is not active: the next one takes its place)."""
    did = False
    while trials_to_create(created=len(trials), trials=config["trials"], parallel=config["parallel"],
                           active=sum(1 for t in trials if t.job is not None and t.job.state in ACTIVE_STATES)):
        number = len(trials)
        params = propose(config, [record_of(t) for t in trials], number)
        trial = trial_submit(parent, number, params)
        if trial is None:
            break
        trials.append(trial)
        did = True
    return did


def trial_document(parent: Job, number: int, params: dict[str, Any]) -> dict[str, Any]:
    """Trial ``number``'s job spec: the sweep's training spec with the trial's parameters, on the
    dataset version (and registered model version) the sweep resolved at submit, so every trial
    trains on the same data even if a new version is pushed meanwhile."""
    spec = parent.spec
    args = {**spec["train_args"], **params}
    inputs = spec.get("inputs") or {}
    data = inputs.get("data") or {}
    if data.get("name") and data.get("version"):
        args["data"] = f"{data['name']}:v{data['version']}"
    model = inputs.get("model") or {}
    if "model" not in params and model.get("kind") == "version":
        args["model"] = f"{model['name']}:v{model['version']}"
    resources: dict[str, Any] = {"gpu": spec["gpus"]}
    if parent.memory_mb:
        resources["memory"] = f"{parent.memory_mb}Mi"
    if parent.cpu_milli:
        resources["cpu"] = f"{parent.cpu_milli}m"
    if parent.gpu_memory_mb:
        resources["gpu_memory"] = f"{parent.gpu_memory_mb}Mi"
    if spec.get("gpu_models"):
        resources["gpu_model"] = spec["gpu_models"]
    document = {
        "task_name": f"{parent.task_name[:180]}-t{number}",
        "train": args,
        "resources": resources,
        "priority": parent.priority_class,
        "team": parent.team.slug,
        "timeout": parent.timeout_s,
        "retries": spec.get("retries", 0),
        "allow_duplicate": True,
        "description": f"trial {number} of sweep {parent.task_name}",
    }
    if spec.get("task_named", True):
        # A task the sweep left to the default stays the model's own; a sweep stored before
        # task_named was recorded keeps the task it was stored with.
        document["task"] = spec.get("task", "detect")
    if spec.get("image"):
        document["image"] = spec["image"]
    return document


def trial_submit(parent: Job, number: int, params: dict[str, Any]) -> Trial | None:
    """Insert trial ``number`` with its job, or find the one another step inserted.

    None when the owner is at MAX_ACTIVE_JOBS_PER_USER: the next pass tries again. A trial
    whose spec is refused (its dataset was deleted, say) is kept as a failed trial with the
    reason; it does not stop the others.
    """
    document = trial_document(parent, number, params)
    try:
        with transaction.atomic():
            trial = Trial.objects.create(sweep=parent, number=number, params=params)
            job, _ = job_submit(user=parent.user, spec=parse_spec(document), parent=parent,
                                raw_spec=yaml.safe_dump(document, sort_keys=False),
                                idempotency_key=f"sweep:{parent.pk}:{number}")
            trial.job = job
            trial.save(update_fields=["job"])
    except IntegrityError:
        return Trial.objects.select_related("job").filter(sweep=parent, number=number).first()
    except TooManyActiveJobs as exc:
        log.info("sweep %s: trial %d waits: %s", parent.pk, number, exc, extra={"job_id": str(parent.pk)})
        return None
    except (SpecError, DuplicateJob) as exc:
        note = f"could not be submitted: {exc}"[:500]
        try:
            with transaction.atomic():
                return Trial.objects.create(sweep=parent, number=number, params=params, note=note, recorded=True)
        except IntegrityError:
            return Trial.objects.select_related("job").filter(sweep=parent, number=number).first()
    return trial


# --- 4. complete --------------------------------------------------------------------------------


def sweep_complete(parent: Job, config: dict, trials: list[Trial]) -> bool:
    if len(trials) < config["trials"] or not all(t.recorded for t in trials):
        return False
    metric = config["metric"]
    complete = [t for t in trials if record_of(t).state == COMPLETE]
    failed = [t for t in trials if t.job is None or (t.job.state in FAILED_STATES and not t.pruned)]
    pruned = [t for t in trials if t.pruned]
    summary = {"trials": len(trials), "completed": len(complete), "pruned": len(pruned), "failed": len(failed)}
    counts = f"{len(complete)} completed, {len(pruned)} pruned, {len(failed)} failed of {len(trials)}"
    if len(failed) == len(trials):
        first = failed[0]
        error = first.note or (first.job.public_error if first.job else "")
        return sweep_finish(parent, state=JobState.FAILED, message=f"every trial failed ({counts})",
                            error=f"every trial failed; trial {first.number}: {error}", data=summary)
    picked = best_pick((t.number, t.value) for t in complete)
    if picked is None:
        return sweep_finish(parent, state=JobState.SUCCEEDED, data=summary,
                            message=f"finished ({counts}); no trial completed, so there is no best one")
    best = next(t for t in complete if t.number == picked.number)
    summary["best"] = {"trial": best.number, "job": str(best.job_id), "value": best.value, "params": best.params,
                       "tied": list(picked.tied)}
    finished = JobEvent.objects.filter(job=best.job, kind="succeeded").order_by("-seq").first()
    kept = (finished.data or {}) if finished else {}
    weights = best_weights(parent, best, kept)  # network I/O: here, never inside sweep_finish's transaction
    if weights is None:
        return False  # the store is unreachable: the sweep waits (its reason says so) and tries again
    return sweep_finish(parent, state=JobState.SUCCEEDED, best=best.job, data=summary,
                        message=f"finished ({counts}); best: trial {best.number}, {metric} {best.value:.4g}"
                                + (f" ({picked.tie_note})" if picked.tie_note else ""),
                        register=lambda: best_register(parent, config, best, weights, kept, summary))


# Sweeps waiting for the artifact store: their pk -> (monotonic time of the next try, pause).
_store_waits: dict = {}
STORE_WAIT_FIRST_S, STORE_WAIT_MAX_S = 2.0, 60.0


def best_weights(parent: Job, best: Trial, kept: dict) -> Path | str | None:
    """The best trial's weights as a file on this machine, or why there are none (a str), or None
    while the artifact store is unreachable.

    With a shared DATA_DIR that is the trial's own file. Without one the GPU server that trained
    it uploaded it to the store (worker.artifacts.results_upload) before the trial succeeded, and
    recorded its sha256 in the trial's ``succeeded`` event: it is fetched into this machine's
    ``ARTIFACTS_CACHE_DIR``, keyed and checked by that hash. The scheduler calls this on a pass,
    outside any transaction; while the store is down the sweep stays running with the reason on
    its row, and tries again after a pause growing to ``STORE_WAIT_MAX_S`` (not on every pass:
    an unreachable store may take seconds to say so, and planning waits for the sweep step).
    """
    job = best.job
    if not job.weights_path:
        return "it wrote no weights file: nothing registered"
    if shared_filesystem():
        path = artifact_path(job.weights_path)
        return path if path.is_file() else "its weights file is gone: nothing registered"
    retry_at, pause = _store_waits.get(parent.pk, (0.0, 0.0))
    if time.monotonic() < retry_at:
        return None
    try:
        path = artifact_local(job.weights_path, str(kept.get("weights_sha256") or ""))
    except StorageUnavailable as exc:
        pause = min(max(pause * 2, STORE_WAIT_FIRST_S), STORE_WAIT_MAX_S)
        _store_waits[parent.pk] = (time.monotonic() + pause, pause)
        message = f"waiting for artifact storage (the best trial's weights): {str(exc)[:300]}"
        field = Job._meta.get_field("reason")
        if Job.objects.filter(pk=parent.pk).exclude(reason__startswith="waiting for artifact storage").update(
                reason=message[: field.max_length]):
            job_event(parent, "storage_wait", message)
        log.warning("sweep %s: %s", parent.pk, message, extra={"job_id": str(parent.pk)})
        return None
    except FileNotFoundError:
        return "its weights file is not in the artifact store: nothing registered"
    except ArtifactChanged as exc:
        log.error("sweep %s: %s", parent.pk, exc, extra={"job_id": str(parent.pk)})
        return "its weights in the artifact store are not the bytes the trial wrote (sha256 differs): nothing registered"
    if _store_waits.pop(parent.pk, None) is not None:
        Job.objects.filter(pk=parent.pk, reason__startswith="waiting for artifact storage").update(reason="")
        job_event(parent, "storage_back", "artifact storage reachable again (the best trial's weights)")
    return path


def best_register(parent: Job, config: dict, best: Trial, weights: Path | str, kept: dict, summary: dict) -> str:
    """Register the best trial's weights (:func:`best_weights`) as the next version of the sweep's
    name, the sweep as lineage, its reference into ``summary["model"]`` (the sweep's final event
    data, which its notification carries); or say why nothing is."""
    if isinstance(weights, str):
        return weights
    job = best.job
    version = model_register(
        job=job, weights=weights, key=job.weights_path, metrics=kept.get("metrics") or {}, code=kept.get("code"),
        name=parent.task_name,
        lineage_extra={"sweep": {"id": str(parent.pk), "task_name": parent.task_name, "method": config["method"],
                                 "metric": config["metric"], "trials": config["trials"], "trial": best.number,
                                 "value": best.value, "params": best.params}})
    summary["model"] = version.reference
    note = registration_note(version)
    return f"its weights are registered as {version}" + (f" ({note})" if note else "")


# --- repair -------------------------------------------------------------------------------------


def orphans_cancel() -> bool:
    """Cancel active trials of a sweep that has ended: one submitted while the sweep was being
    cancelled (``jobs.services.sweep_cancel``), or one whose cancel a crash interrupted; and
    a pruned trial whose cancel never happened."""
    did = False
    orphans = (Job.objects.filter(parent__isnull=False, state__in=ACTIVE_STATES, cancel_requested_at__isnull=True)
               .filter(~Q(parent__state=JobState.RUNNING) | Q(trial__pruned_epoch__isnull=False))
               .select_related("parent", "trial", "team"))
    for job in orphans:
        trial = getattr(job, "trial", None)
        reason = (trial.note if trial is not None and trial.pruned
                  else f"its sweep {job.parent.task_name} has ended ({job.parent.state})")
        did |= job_cancel(job=job, by=None, reason=reason)
    return did
