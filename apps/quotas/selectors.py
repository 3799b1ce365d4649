from __future__ import annotations

from datetime import timedelta

from django.db.models import Sum
from django.utils import timezone

from apps.accounts.selectors import team_list
from apps.jobs.models import HOLDING_STATES, Job

from .models import TeamQuota, UsageRecord


def user_quota_gpu_hours(*, user, team) -> float | None:
    """The per-user rolling 24 h GPU-hour quota in force for jobs charged to ``team``: the
    team's override, else the scheduler configuration (None = no limit). The same rule as
    the scheduler's (apps.scheduling.inputs.team_policies)."""
    from apps.scheduling.models import SchedulerConfig

    if team is not None:
        override = TeamQuota.objects.filter(team=team).values_list("user_gpu_hours_per_day", flat=True).first()
        if override is not None:
            return override
    return SchedulerConfig.current().user_gpu_hours_per_day


def user_gpu_hours_24h(*, user, now=None) -> float:
    """GPU-hours the user's attempts used in the last 24 h, across teams, running ones included."""
    now = now or timezone.now()
    done = UsageRecord.objects.filter(user=user, ended_at__gte=now - timedelta(hours=24)).aggregate(
        s=Sum("gpu_seconds"))["s"] or 0.0
    live = running_gpu_seconds(Job.objects.filter(user=user, state__in=HOLDING_STATES), now)
    return (done + live) / 3600


def running_gpu_seconds(jobs, now) -> float:
    return sum(j.gpus * (now - j.started_at).total_seconds() for j in jobs if j.started_at)


def usage_summary(*, user) -> dict:
    """GPU-hours used (finished attempts + what runs now) for the caller and their teams."""
    now = timezone.now()
    day_ago, week_ago = now - timedelta(hours=24), now - timedelta(days=7)

    def hours(records, running) -> dict:
        day = (records.filter(ended_at__gte=day_ago).aggregate(s=Sum("gpu_seconds"))["s"] or 0.0)
        week = (records.filter(ended_at__gte=week_ago).aggregate(s=Sum("gpu_seconds"))["s"] or 0.0)
        live = running_gpu_seconds(running, now)
        return {"gpu_hours_24h": round((day + live) / 3600, 3), "gpu_hours_7d": round((week + live) / 3600, 3)}

    mine = hours(UsageRecord.objects.filter(user=user),
                 Job.objects.filter(user=user, state__in=HOLDING_STATES))
    teams = {}
    my_teams = list(team_list(user=user))
    # The quota of the team a job is charged to by default (the first one, as submit does).
    quota = user_quota_gpu_hours(user=user, team=my_teams[0] if my_teams else None)
    mine.update({"quota_gpu_hours_24h": quota,
                 "quota_left_gpu_hours_24h": None if quota is None else round(max(0.0, quota - mine["gpu_hours_24h"]), 3)})
    for team in my_teams:
        teams[team.slug] = hours(UsageRecord.objects.filter(team=team),
                                 Job.objects.filter(team=team, state__in=HOLDING_STATES))
        teams[team.slug]["my_quota_gpu_hours_24h"] = user_quota_gpu_hours(user=user, team=team)
    return {"user": user.username, "me": mine, "teams": teams}


def team_quota_warnings(*, quota: TeamQuota) -> list[str]:
    """What a saved quota makes impossible, a sentence each, for the superuser who saved it.

    Warnings, not refusals: a max of 0 (or 0.5) is a legitimate way to stop a team's new starts
    (or keep it to shared GPUs) for a while, and the urgent max in force may be the site default,
    which changes apart from this row. But it was saved without a word while every queued 1-GPU
    job of the team could no longer start (manager trial 15, F12).
    """
    from apps.jobs.models import JobState
    from apps.scheduling.inputs import team_policies
    from apps.scheduling.models import SchedulerConfig

    slug, said = quota.team.slug, []
    if quota.user_gpu_hours_per_day == 0:
        said.append(f"user GPU-hours per day 0: no member of {slug} may start a job until it is raised or "
                    f"emptied (empty = the site default)")
    most = quota.max_gpus
    if most is None:
        return said
    config = SchedulerConfig.current().to_policy()
    urgent = team_policies(config)[slug].urgent_max_gpus
    if quota.urgent_max_gpus is None and urgent is not None and urgent > most:
        said.append(f"max GPUs {most:g} is below the urgent max GPUs in force, {urgent:g} (site default): "
                    f"{slug} holds at most {most:g} GPU{'s' if most != 1 else ''} at once, urgent jobs included, "
                    f"so urgent jobs get {most:g}, not {urgent:g}; set this team's urgent max GPUs to say so")
    waiting = Job.objects.filter(team=quota.team, state=JobState.QUEUED, is_sweep=False, gpus__gt=most).count()
    if most < 1 or waiting:
        said.append(f"max GPUs {most:g}: a job of {slug} that needs more than {most:g} GPU"
                    f"{'s' if most != 1 else ''}{' (any 1-GPU job)' if most < 1 else ''} can never start; "
                    + (f"{waiting} of its queued jobs need{'s' if waiting == 1 else ''} more and wait"
                       f"{'s' if waiting == 1 else ''} until max GPUs is raised" if waiting
                       else "none of its queued jobs does at present"))
    return said
