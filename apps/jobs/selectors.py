"""Reads about jobs, always scoped to what the caller may see."""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from django.db.models import QuerySet

from apps.accounts.selectors import is_manager_of, managed_team_ids, team_ids
from apps.core.selectors import scoped_get

from .models import ACTIVE_STATES, STATE_GROUPS, Job, JobState

JOB_NOT_VISIBLE = "No job with that id in your teams."


def job_list(*, user, state: str | None = None, team: str | None = None, mine: bool = False,
             owner=None) -> QuerySet[Job]:
    """The caller's teams' jobs; ``state`` is a JobState or a group of them (STATE_GROUPS: active, finished)."""
    ids = team_ids(user=user)
    # One team (the usual case) as an equality: SQLite reads "team_id IN (?)" as several
    # index ranges and sorts them, where "team_id = ?" pages straight out of the index.
    visible = {"team_id": ids[0]} if len(ids) == 1 else {"team_id__in": ids}
    jobs = Job.objects.filter(**visible).select_related("team", "user", "node")
    if state in STATE_GROUPS:
        jobs = jobs.filter(state__in=STATE_GROUPS[state])
    elif state:
        jobs = jobs.filter(state=state)
    if team:
        jobs = jobs.filter(team__slug=team)
    if mine:
        jobs = jobs.filter(user=user)
    if owner is not None:
        jobs = jobs.filter(user=owner)
    return jobs


def job_get(*, user, job_id) -> Job | None:
    """The job if the caller may see it; None otherwise (the API answers 404 either way)."""
    return scoped_get(job_list(user=user), job_id)


def job_may_cancel(*, user, job: Job) -> bool:
    """Who may cancel a job: its owner or a manager of its team (API, pages and CLI alike)."""
    return job.user_id == user.pk or is_manager_of(user=user, team=job.team)


def queue_list(*, user, team: str | None = None, mine: bool = False, owner=None) -> QuerySet[Job]:
    """Queued jobs of the caller's teams in the order the scheduler will consider them."""
    return (
        job_list(user=user, state=JobState.QUEUED, team=team, mine=mine, owner=owner)
        .order_by("queue_position", "created_at")
    )


def queue_depth_by_class() -> dict[str, int]:
    """Cluster-wide counts (no job details), for dashboards."""
    counts = {c: 0 for c in ("low", "medium", "high", "urgent")}
    for cls in Job.objects.filter(state=JobState.QUEUED).values_list("priority_class", flat=True):
        counts[cls] = counts.get(cls, 0) + 1
    return counts


def active_jobs_of(*, user) -> QuerySet[Job]:
    return job_list(user=user, mine=True).filter(state__in=ACTIVE_STATES)


def team_active_jobs(*, user) -> QuerySet[Job]:
    """Queued and running jobs of the teams the caller manages, their own left out (the dashboard
    lists those apart): what a manager watches (trial 14, F14). Empty for a plain member."""
    managed = set(managed_team_ids(user=user)) & set(team_ids(user=user))
    return (Job.objects.filter(team_id__in=managed, state__in=ACTIVE_STATES).exclude(user=user)
            .select_related("team", "user", "node"))


def job_may_requeue(*, user, job: Job) -> bool:
    """Who may requeue a starting/running job or change a queued job's class: a manager of its
    team (the API's requeue and the admin's actions alike; the owner may not)."""
    return is_manager_of(user=user, team=job.team)


@dataclass(frozen=True)
class JobWeightsFound:
    """What ``jobs/{id}/weights/`` serves: an artifact ``key`` and its ``sha256`` ('' = not recorded).

    ``epoch`` is the epoch a checkpoint is from (None for a finished run's final weights); ``note``
    says which weights they are, ``missing`` (with no key) why there are none.
    """

    key: str = ""
    sha256: str = ""
    epoch: int | None = None
    note: str = ""
    missing: str = ""
    folder_of: UUID | None = None  # the job whose folder holds ``key`` when it is not this job's (a sweep's best trial)


def sweep_best_trial(sweep: Job) -> Job | None:
    """The trial whose weights an ended sweep kept (its ``weights_path``): the one its best version
    was registered from (``apps.sweeps.services.best_register``); None before that, or without one."""
    if not (sweep.is_sweep and sweep.weights_path):
        return None
    return (sweep.children.filter(weights_path=sweep.weights_path)
            .select_related("model_version", "trial").order_by("created_at").first())


def job_weights_find(job: Job) -> JobWeightsFound:
    """The weights a job's owner may download, or why there are none.

    1. A succeeded training job: its final best.pt (``weights_path``), which its model version holds.
    2. A failed, cancelled or timed-out one: the stored checkpoint Ultralytics also wrote as best.pt
       (the newest ``best`` row), else its newest stored checkpoint (last.pt of that epoch); they
       stay in the artifact store ``CHECKPOINT_RETENTION_DAYS`` (apps/jobs/checkpoint_retention.py).
    3. Anything else: the reason, in words that fit the job's state (an ended job never "yet").
    """
    if job.is_sweep:
        # Its weights are its best trial's file: served from that trial's folder, checked against the
        # version registered from it. They were refused as "gone" (outside the sweep's own folder)
        # while the job said they were there (CI trial 17, H5).
        best = sweep_best_trial(job)
        if best is None:
            return JobWeightsFound(missing="A sweep has no weights of its own; its trials have theirs "
                                           "(the best one's is registered as a model).")
        version, trial = getattr(best, "model_version", None), getattr(best, "trial", None)
        which = f"trial {trial.number} ({best.task_name})" if trial is not None else best.task_name
        return JobWeightsFound(key=best.weights_path, sha256=version.sha256 if version else "", folder_of=best.pk,
                               note=f"the final weights (best.pt) of {which}, the sweep's best"
                                    + (f", registered as {version.reference}" if version else ""))
    if job.weights_path:
        version = getattr(job, "model_version", None)
        return JobWeightsFound(key=job.weights_path, sha256=version.sha256 if version else "",
                               note="the final weights (best.pt) of the finished run")
    mode = (job.spec or {}).get("mode") or "train"
    if mode != "train":
        if mode == "export":  # "A export job …", and no word of where its files are (CI trial 17, H13)
            return JobWeightsFound(missing="An export job trains nothing, so it has no weights; its exported files "
                                           "are in its outcome (outcome.exports, each with its download).")
        return JobWeightsFound(missing=f"A {mode} job trains nothing, so it has no weights.")
    if job.state in ACTIVE_STATES:
        return JobWeightsFound(missing=f"This job has no weights yet: it is {job.state}; they are here once it succeeds.")
    if job.state == JobState.SUCCEEDED:
        return JobWeightsFound(missing="The job succeeded but recorded no weights file.")
    ended = {JobState.CANCELLED: "was cancelled", JobState.TIMED_OUT: "timed out"}.get(job.state, job.state)
    stored = job.checkpoints.exclude(key="")
    checkpoint = stored.filter(best=True).order_by("-epoch").first() or stored.order_by("-epoch").first()
    if checkpoint is not None:
        which = "best.pt" if checkpoint.best else "last.pt"
        return JobWeightsFound(key=checkpoint.key, sha256=checkpoint.sha256, epoch=checkpoint.epoch,
                               note=f"the job {ended} after {job.epochs_done} epochs: its {which} as of epoch "
                                    f"{checkpoint.epoch} (a training checkpoint)")
    if job.first_started_at is None:  # cancelled while queued: "before its first epoch ended" read as if it ran
        return JobWeightsFound(missing=f"The job {ended} before it started, so it has no weights.")
    if not job.epochs_done:
        return JobWeightsFound(missing=f"The job {ended} before its first epoch ended, so it has no weights.")
    return JobWeightsFound(missing=f"The job {ended} after {job.epochs_done} epochs, but none of its checkpoints is "
                                   "kept in the artifact store (they leave it CHECKPOINT_RETENTION_DAYS after the "
                                   "job ended, or stayed on the server that ran it).")
