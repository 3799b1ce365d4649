"""Reads about jobs, always scoped to what the caller may see."""

from __future__ import annotations

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
