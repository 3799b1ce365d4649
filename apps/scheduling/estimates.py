"""Runtime estimates for the live scheduler, from the database (the model itself is pure:
:mod:`apps.scheduling.policy.runtime_model`).

- A queued job: the runtime model fitted over recent succeeded jobs (a fixed overhead,
  measured from their epochs' report times, plus epochs × a per-epoch time scaled by
  imgsz, dataset size, model and GPUs); with no finished job at all, the spec's
  ``expected_duration``; with neither, nothing (the policy then assumes its stated
  default, ``DEFAULT_RUNTIME_S``). Never the timeout. A requeued job needs only the
  epochs it has left, and the overhead again.
- A running job: once it has finished an epoch in this attempt, its own epoch rate
  (between its epoch ends; with one epoch, that epoch less the usual start-up, weighed
  against what finished runs of its shape took an epoch) times the epochs left, plus the
  usual time after the last epoch; before that, the same estimate as a queued job,
  counted from its start.
- A val, predict or export job (no epochs): its ``expected_duration``, else the median
  runtime of recently finished jobs of its mode, else the stated default of its mode,
  ``MODE_DEFAULT_RUNTIME_S`` (minutes, not the training default's hour: on a new
  installation six such jobs queued behind a training were told "start in 15.3 h" and all
  finished within 40 s; new-user trial 23). The model is fitted on training jobs only.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, F, Max, Min, Sum

from apps.datasets.models import Dataset
from apps.jobs.models import Job, JobState, MetricPoint
from apps.quotas.models import UsageRecord

from .policy.runtime_model import EpochTiming, RunFeatures, RuntimeModel, model_scale, remaining_from_epochs

FIT_SAMPLES = 500  # most recent succeeded jobs the model is fitted on
MIN_HISTORY = 5  # below this many finished jobs a spec's expected_duration beats the model
# What a val, predict or export job is assumed to take before any job of its mode has finished
# (a pass over a validation split, a folder of images, one export with its check): a stated
# default, replaced by the median of that mode's own runtimes from its first success on.
MODE_DEFAULT_RUNTIME_S = {"val": 300.0, "predict": 300.0, "export": 300.0}
ULTRALYTICS_DEFAULT_EPOCHS = 100
ULTRALYTICS_DEFAULT_IMGSZ = 640


@dataclass(frozen=True)
class Estimates:
    runtime_s: dict[str, float]  # job id -> estimated total (queued: remaining) runtime; absent = no data
    remaining_s: dict[str, float]  # running job id -> seconds left
    sigma: float | None  # lognormal error of the model's estimates; None = no model


def _mode(job: Job) -> str:
    return job.spec.get("mode") or "train"


def _epochs(job: Job) -> int:
    return int((job.spec.get("train_args") or {}).get("epochs") or ULTRALYTICS_DEFAULT_EPOCHS)


def features(job: Job, images: dict[tuple[int, str], int]) -> RunFeatures:
    args = job.spec.get("train_args") or {}
    count = images.get((job.team_id, str(args.get("data") or "")))
    seen = float(count) * float(args.get("fraction") or 1.0) if count else None
    return RunFeatures(
        epochs=float(_epochs(job)),
        images=seen if seen else RunFeatures.images,
        imgsz=float(args.get("imgsz") or ULTRALYTICS_DEFAULT_IMGSZ),
        scale=model_scale(args.get("model")),
        gpus=job.gpus,
    )


def dataset_images(jobs: Iterable[Job]) -> dict[tuple[int, str], int]:
    teams = {j.team_id for j in jobs}
    return {(team, name): n for team, name, n in Dataset.objects.filter(team_id__in=teams)
            .values_list("team_id", "name", "num_images")}


# The fitted model, kept while no job has succeeded and no usage was charged since: ((newest
# succeeded job's pk and finished_at, newest usage record's pk), when fitted (monotonic), the model).
_fitted: tuple[tuple | None, float, RuntimeModel | None] | None = None
FIT_MAX_AGE_S = 300.0  # refitted at least this often (rows purged, a dataset's size re-read)


def fit_runtime_model() -> RuntimeModel | None:
    """The model over the most recent succeeded jobs; runtime = GPU-seconds charged / GPUs (all attempts).

    Every scheduler pass asks for it, and fitting reads 500 jobs and their usage (64 of a
    229 ms pass's CPU with 20 queued and 500 finished jobs, in a scratch test). The fit
    changes only when a job succeeds, and its usage is charged in the same transaction: so
    it is kept while the newest succeeded job and the newest usage record are the same ones
    (two index seeks), and at most ``FIT_MAX_AGE_S``.
    """
    global _fitted
    newest = (Job.objects.filter(state=JobState.SUCCEEDED).order_by("-finished_at")
              .values_list("pk", "finished_at").first())
    key = (newest, UsageRecord.objects.order_by("-pk").values_list("pk", flat=True).first())
    kept = _fitted
    if kept is not None and kept[0] == key and time.monotonic() - kept[1] < FIT_MAX_AGE_S:
        return kept[2]
    model = _fit() if newest is not None else None
    _fitted = (key, time.monotonic(), model)
    return model


def fit_generation() -> object:
    """Changes (by identity) whenever the model is fitted again — also when the fit is None
    (no training job has succeeded) while other modes' median runtimes may have moved."""
    return _fitted


def fitted_model_forget() -> None:
    """Fit again on the next call (tests: a database rolled back under a kept model)."""
    global _fitted
    _fitted = None


def _fit() -> RuntimeModel | None:
    # Only what features() and the epoch timing read (500 whole rows: 109 ms of CPU, 70 ms so).
    finished = [j for j in Job.objects.filter(state=JobState.SUCCEEDED)
                .only("id", "team_id", "gpus", "spec", "attempt", "started_at", "finished_at")
                .order_by("-finished_at")[:FIT_SAMPLES] if _mode(j) == "train"]
    if not finished:
        return None
    charged = dict(UsageRecord.objects.filter(job__in=finished).values_list("job_id").annotate(s=Sum("gpu_seconds")))
    images = dataset_images(finished)
    timings = epoch_timings(finished)
    samples = [(features(j, images), charged[j.pk] / max(j.gpus, 1e-9), timings.get(j.pk))
               for j in finished if charged.get(j.pk)]
    return RuntimeModel.fit(samples)


def epoch_progress(jobs: Sequence[Job]) -> dict:
    """job pk -> (first epoch's report time, last one's, epochs) of each job's current
    attempt, counting only epochs reported since that attempt started (a redone epoch keeps
    the report time of its first try)."""
    rows = (MetricPoint.objects.filter(job__in=[j for j in jobs if j.started_at], attempt=F("job__attempt"),
                                       created_at__gte=F("job__started_at"))
            .values("job_id").annotate(first=Min("created_at"), last=Max("created_at"),
                                       epochs=Count("epoch", distinct=True)))
    return {row["job_id"]: (row["first"], row["last"], row["epochs"]) for row in rows}


def epoch_timings(finished: Sequence[Job]) -> dict:
    """job pk -> EpochTiming of each finished job whose last attempt reported two epochs or more."""
    timings = {}
    by_pk = {j.pk: j for j in finished}
    for pk, (first, last, epochs) in epoch_progress(finished).items():
        job = by_pk[pk]
        # Report times, not the child's clock: a relay that posts every few seconds may bring
        # a short run's epochs all at once, which times nothing.
        if epochs < 2 or job.finished_at is None or last <= first:
            continue
        per_epoch = (last - first).total_seconds() / (epochs - 1)
        timings[pk] = EpochTiming(
            per_epoch=per_epoch,
            start=max(0.0, (first - job.started_at).total_seconds() - per_epoch),
            end=max(0.0, (job.finished_at - last).total_seconds()),
        )
    return timings


def mode_median_runtime(mode: str) -> float | None:
    """Median runtime (GPU-seconds charged / GPUs) of the most recent succeeded jobs of a non-training mode."""
    recent = list(Job.objects.filter(state=JobState.SUCCEEDED, spec__mode=mode).only("id", "gpus")
                  .order_by("-finished_at")[:FIT_SAMPLES])
    charged = dict(UsageRecord.objects.filter(job__in=recent).values_list("job_id").annotate(s=Sum("gpu_seconds")))
    runtimes = sorted(charged[j.pk] / max(j.gpus, 1e-9) for j in recent if charged.get(j.pk))
    return runtimes[len(runtimes) // 2] if runtimes else None


@dataclass(frozen=True)
class Basis:
    """What a job's runtime estimate is made from, apart from the fitted model: a scheduler
    keeps it with each queued row (inputs.QueueRows) and, when the model changes (a job
    succeeded), only multiplies again (``runtime_estimate``)."""

    mode: str
    given: float  # the spec's expected_duration_s, 0 = none
    x: tuple[float, ...] | None  # the run's features (RunFeatures.vector) of a training job
    left: float  # epochs still to run
    share: float  # their share of all epochs (what is left of an expected_duration)


def estimate_basis(job: Job, images: dict[tuple[int, str], int]) -> Basis:
    mode = _mode(job)
    given = float(job.spec.get("expected_duration_s") or 0)
    if mode != "train":
        return Basis(mode, given, None, 1.0, 1.0)
    epochs = _epochs(job)
    left = max(0, epochs - job.epochs_done)
    return Basis(mode, given, features(job, images).vector(), float(left), left / epochs)


def runtime_estimate(basis: Basis, model: RuntimeModel | None, by_mode: dict[str, float | None]) -> float | None:
    """Seconds of runtime left, or None (no data: the policy assumes its stated default).

    ``by_mode``: median runtimes of non-training modes found so far (filled here as needed).
    """
    if basis.x is None:  # no epochs: what was given, else how long such jobs took lately, else the mode's default
        if basis.mode not in by_mode:
            by_mode[basis.mode] = mode_median_runtime(basis.mode)
        total = basis.given or by_mode[basis.mode] or MODE_DEFAULT_RUNTIME_S.get(basis.mode, 0.0)
        return max(1.0, total) if total > 0 else None
    if basis.given and (model is None or model.samples < MIN_HISTORY):
        return max(1.0, basis.given * basis.share)
    if model is None:
        return None
    return max(1.0, model.predict_vector(basis.x, basis.left))


def job_estimates(
    queued: Sequence[Job], holding: Sequence[Job], now: datetime, model: RuntimeModel | None = None
) -> Estimates:
    """Estimates for these jobs (``model``: an already fitted one, else fitted here)."""
    model = model or fit_runtime_model()
    images = dataset_images([*queued, *holding])
    runtime: dict[str, float] = {}
    by_mode: dict[str, float | None] = {}
    for job in [*queued, *holding]:
        total = runtime_estimate(estimate_basis(job, images), model, by_mode)
        if total is not None:
            runtime[str(job.pk)] = total
    remaining: dict[str, float] = {}
    progress = epoch_progress(holding)
    for job in holding:
        row = progress.get(job.pk)
        if row is None or job.started_at is None:
            continue
        first, last, epochs = row
        left = remaining_from_epochs(
            _epochs(job), job.epochs_done, epochs, (last - job.started_at).total_seconds(),
            seconds_between=(last - first).total_seconds(), model=model, x=features(job, images).vector(),
        )
        if left is not None:
            remaining[str(job.pk)] = left
    return Estimates(runtime, remaining, model.sigma if model else None)
