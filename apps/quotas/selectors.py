from __future__ import annotations

from datetime import timedelta

from django.db.models import Sum
from django.utils import timezone

from apps.accounts.selectors import team_list
from apps.jobs.models import HOLDING_STATES, Job

from .models import UsageRecord

DEFAULT_USER_GPU_HOURS_PER_DAY = 20.0


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
    quota = DEFAULT_USER_GPU_HOURS_PER_DAY
    mine.update({"quota_gpu_hours_24h": quota, "quota_left_gpu_hours_24h": round(max(0.0, quota - mine["gpu_hours_24h"]), 3)})
    teams = {}
    for team in team_list(user=user):
        teams[team.slug] = hours(UsageRecord.objects.filter(team=team),
                                 Job.objects.filter(team=team, state__in=HOLDING_STATES))
    return {"user": user.username, "me": mine, "teams": teams}
