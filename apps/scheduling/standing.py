"""A team's limits in force and its fair-share standing, as the scheduler sees them now
(trial 14, F33/F36): read for the team's members, never computed a second way.

The limits are ``team_policies`` (a team's override, else the site default from the
scheduler configuration) and the use against them is ``usage_inputs`` (rolling 24 h, the
urgent allowance's window); the standing is the policy's own ``team_levels`` and
``fair_tree`` over the pairs the scheduler ranks: every (team, user) with a queued job or
decayed usage.
"""

from __future__ import annotations

import math
from datetime import datetime

from django.db.models import QuerySet
from django.utils import timezone

from apps.accounts.models import Team
from apps.accounts.selectors import role_in, team_list
from apps.accounts.services import storage_limit_bytes, storage_quota_gb, storage_used_bytes
from apps.jobs.models import HOLDING_STATES, Job, JobState
from apps.quotas.models import TeamQuota

from .inputs import team_policies, usage_inputs
from .models import SchedulerConfig
from .policy.priority import fair_tree, team_levels

TEAM_NOT_VISIBLE = "No team with that id in your teams."
SITE_DEFAULT, TEAM_OVERRIDE = "site default", "team"


def standing_teams(*, user) -> QuerySet[Team]:
    """Teams whose limits and standing the caller may read: their own (every team for a superuser)."""
    return team_list(user=user).order_by("slug")


def _hours(gpu_seconds: float) -> float:
    return round(gpu_seconds / 3600.0, 3)


def team_standings(*, user, teams: list[Team], now: datetime | None = None) -> list[dict]:
    """For each of ``teams`` (already scoped to ``user``): the limits in force with their source
    and what is used against them, and the fair-share standing. One read of usage for all."""
    now = now or timezone.now()
    config = SchedulerConfig.current().to_policy()
    policies = team_policies(config)
    overrides = {q.team_id: q for q in TeamQuota.objects.filter(team__in=teams)}
    holding = list(Job.objects.filter(state__in=HOLDING_STATES, node__isnull=False).select_related("team", "user"))
    usage, user_24h, _, urgent_24h = usage_inputs(config, holding, now)
    # The pairs the scheduler ranks (apps.scheduling.policy.priority.fairshare_factors).
    pairs = set(usage) | set(Job.objects.filter(state=JobState.QUEUED, is_sweep=False)
                             .values_list("team__slug", "user__username").distinct())
    factors = fair_tree(pairs, usage, policies, config.default_team)
    return [_standing(user=user, team=team, now=now, config=config, policy=policies[team.slug],
                      override=overrides.get(team.pk), holding=holding, usage=usage, user_24h=user_24h,
                      urgent_24h=urgent_24h, pairs=pairs, factors=factors, policies=policies)
            for team in teams]


def limits_in_force(*, config, policy, override: TeamQuota | None) -> dict[str, dict]:
    """Each limit the scheduler applies to a team (``policy``: its ``team_policies`` entry) with
    its source: the team's own quota row (``override``) or the site default. The Teams page and
    the team quota's admin page both show these."""
    def limit(field: str, value) -> dict:
        set_here = override is not None and getattr(override, field) is not None
        return {"value": value, "source": TEAM_OVERRIDE if set_here else SITE_DEFAULT}

    per_job = policy.max_gpus_per_job if policy.max_gpus_per_job is not None else config.max_gpus_per_job
    per_member = (policy.user_gpu_hours_per_day if policy.user_gpu_hours_per_day is not None
                  else config.user_gpu_hours_per_day)
    return {
        "max_gpus": limit("max_gpus", policy.max_gpus),
        "max_gpus_per_job": limit("max_gpus_per_job", per_job),
        "user_gpu_hours_per_day": limit("user_gpu_hours_per_day", per_member),
        "urgent_gpu_hours_per_day": limit("urgent_gpu_hours_per_day", policy.urgent_gpu_hours_per_day),
        "urgent_max_gpus": limit("urgent_max_gpus", policy.urgent_max_gpus),
    }


def _standing(*, user, team, now, config, policy, override, holding, usage, user_24h, urgent_24h, pairs,
              factors, policies) -> dict:
    mine = [j for j in holding if j.team_id == team.pk]
    held = sum(j.gpus for j in mine)
    held_urgent = sum(j.gpus for j in mine if (j.run_class or j.priority_class) == "urgent")
    limits = limits_in_force(config=config, policy=policy, override=override)
    limits["max_gpus"]["in_use"] = held
    limits["user_gpu_hours_per_day"]["my_used_24h"] = _hours(user_24h.get(user.username, 0.0))
    limits["urgent_gpu_hours_per_day"]["used_24h"] = _hours(urgent_24h.get(team.slug, 0.0))
    limits["urgent_max_gpus"]["in_use"] = held_urgent
    # Not the scheduler's: what uploads (dataset versions, weights) may keep, as storage_reserve charges it.
    # GiB as the setting is given, and bytes, which a small team's use does not round to 0.
    used_bytes = storage_used_bytes(team)
    limits["storage_gb"] = {
        "value": storage_quota_gb(team),
        "source": TEAM_OVERRIDE if team.storage_quota_gb is not None else SITE_DEFAULT,
        "used": round(used_bytes / 1024**3, 3),
        "used_bytes": used_bytes,
        "limit_bytes": storage_limit_bytes(team),
    }
    return {
        "id": team.pk, "team": team.slug, "name": team.name, "role": role_in(user=user, team=team),
        "window": "rolling 24 h", "limits": limits,
        # Who may spend the urgent allowance (Team.urgent_by: "members" or "managers"), and
        # whether the queue is ranked by fair share at all (policy "fifo": it is not).
        "urgent_by": team.urgent_by,
        "policy": config.policy,
        "fair_share": _fair_share(user=user, team=team, config=config, usage=usage, pairs=pairs, factors=factors,
                                  policies=policies),
    }


def _fair_share(*, user, team, config, usage, pairs, factors, policies) -> dict:
    """The team's first-step level (its share of the shares over its share of the decayed usage)
    and the Fair Tree factor of each of its users the scheduler ranks now. A team without queued
    jobs or usage is counted in as it would be with a first job, so it always has a standing."""
    members: dict[str, set[str]] = {}
    for team_slug, username in pairs:
        members.setdefault(team_slug, set()).add(username)
    members.setdefault(team.slug, set())
    level = team_levels(members, usage, policies, config.default_team)[team.slug]
    me = (team.slug, user.username)
    my_factor = factors.get(me)
    if my_factor is None and not user.is_superuser:  # "what a first job of mine would get"
        my_factor = fair_tree(pairs | {me}, usage, policies, config.default_team)[me]
    share_fraction = level.shares / level.total_shares
    usage_fraction = level.usage / level.total_usage if level.total_usage > 0 else 0.0
    if level.usage <= 0:
        standing = "no decayed usage: ranked ahead of every team that has some"
    elif math.isclose(level.level, 1.0, rel_tol=0.01):
        standing = "used about its share"
    elif level.level > 1.0:
        standing = "under-served: used less than its share, so its jobs rank ahead"
    else:
        standing = "over-served: used more than its share, so its jobs rank behind"
    return {
        "shares": level.shares,
        "total_shares": level.total_shares,
        "teams_counted": len(members),
        "share_fraction": round(share_fraction, 4),
        "decayed_gpu_hours": _hours(level.usage),
        "total_decayed_gpu_hours": _hours(level.total_usage),
        "usage_fraction": round(usage_fraction, 4),
        "level": None if math.isinf(level.level) else round(level.level, 4),
        "standing": standing,
        "half_life_hours": round(config.half_life_s / 3600.0, 3),
        "members": sorted(({"user": u, "factor": round(factors[(team.slug, u)], 4),
                            "decayed_gpu_hours": _hours(usage.get((team.slug, u), 0.0))}
                           for u in members[team.slug] if (team.slug, u) in factors),
                          key=lambda row: (-row["factor"], row["user"])),
        "my_factor": None if my_factor is None else round(my_factor, 4),
        "my_factor_if_submitted": me not in factors and my_factor is not None,
    }
