"""A member taken out of a team leaves no job behind that would still be run for it (trial 14, F40).

Chosen:
- their **queued** jobs in that team are cancelled at once, in the removal's transaction, each
  with the reason "its owner <user> was removed from <team>" and, through ``job_cancel``, an
  audited ``job.cancel`` by whoever removed them (``manage.py team``: the operator's label,
  accounts.services.operator_named). Nothing waits to run charged to a team its owner left, which its owner
  could no longer see or cancel.
- their **sweeps** in that team are cancelled too (a sweep keeps queuing trials as its owner).
- their **running** (or starting) jobs are left to finish: work in progress the team may want
  (checkpoints, a model version), which the team's managers still see and may cancel from the
  job page. The removal says how many, and names them.
"""

from __future__ import annotations

from apps.core.departures import Departure, on_departure

from .models import HOLDING_STATES, Job, JobState

SHOWN = 3


def _jobs(*, user, team):
    return Job.objects.filter(user=user, team=team, parent__isnull=True)


def _counted(count: int, what: str) -> str:
    return f"{count} {what} job{'s' if count != 1 else ''}"


def _names(jobs) -> str:
    names = [job.task_name for job in jobs[: SHOWN + 1]]
    return ", ".join(names[:SHOWN]) + (" …" if len(names) > SHOWN else "")


def departure_preview(*, user, team) -> str | None:
    jobs = _jobs(user=user, team=team)
    queued = jobs.filter(state=JobState.QUEUED, is_sweep=False).count()
    sweeps = jobs.filter(is_sweep=True, state__in=(JobState.QUEUED, *HOLDING_STATES)).count()
    running = list(jobs.filter(state__in=HOLDING_STATES, is_sweep=False).order_by("created_at"))
    if not queued and not sweeps and not running:
        return None
    parts = []
    if queued or sweeps:
        what = " and ".join(([_counted(queued, "queued")] if queued else [])
                            + ([f"{sweeps} sweep{'s' if sweeps != 1 else ''}"] if sweeps else []))
        parts.append(f"{what} will be cancelled")
    if running:
        parts.append(f"{_counted(len(running), 'running')} ({_names(running)}) will be left to finish; "
                     f"a manager may cancel {'them' if len(running) != 1 else 'it'} from the job page")
    # Not "bob has …": admin messages capitalise their first letter, and usernames are case-sensitive.
    return f"Active jobs of {user.get_username()} in {team.slug}: " + "; ".join(parts) + "."


def departure_apply(*, user, team, by, why: str = "") -> Departure | None:
    from .services import job_cancel

    jobs = _jobs(user=user, team=team)
    # Who removed them is job_cancel's to say ("cancelled by alice" / "by operator (manage.py …)").
    reason = why or f"its owner {user.get_username()} was removed from {team.slug}"
    waiting = list(jobs.filter(state=JobState.QUEUED).order_by("created_at"))
    waiting += list(jobs.filter(is_sweep=True, state__in=HOLDING_STATES).order_by("created_at"))
    cancelled = [job for job in waiting if job_cancel(job=job, by=by, reason=reason)]
    running = list(jobs.filter(state__in=HOLDING_STATES, is_sweep=False).order_by("created_at"))
    if not cancelled and not running:
        return None
    parts = []
    queued = [job for job in cancelled if not job.is_sweep]
    sweeps = [job for job in cancelled if job.is_sweep]
    if queued:
        parts.append(f"{_counted(len(queued), 'queued')} cancelled ({_names(queued)})")
    if sweeps:
        parts.append(f"{len(sweeps)} sweep{'s' if len(sweeps) != 1 else ''} cancelled ({_names(sweeps)})")
    if running:
        parts.append(f"{_counted(len(running), 'running')} left to finish ({_names(running)}); "
                     f"a manager may cancel {'them' if len(running) != 1 else 'it'} from the job page")
    return Departure(message=f"Jobs of {user.get_username()} in {team.slug}: " + "; ".join(parts),
                     data={"cancelled_jobs": [str(job.pk) for job in cancelled],
                           "running_jobs": [str(job.pk) for job in running]})


def register() -> None:
    on_departure(preview=departure_preview, apply=departure_apply)
