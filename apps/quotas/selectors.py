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
