"""Quotas and the urgent allowance inside one planning pass.

:class:`QuotaLedger` keeps the per-team and per-user totals that quotas are checked
against, updated as the pass starts and preempts jobs, and answers "is this job held by
a quota, and until when?".
"""

from __future__ import annotations

from .explain import Waiting
from .placement import EPS
from .types import DAY_S, Allocation, ClusterState, JobRequest, PolicyConfig, TeamPolicy


def request_24h(job: JobRequest) -> float:
    """GPU-seconds the job may use in the next 24 h (what the urgent allowance is checked against)."""
    return job.gpus * min(job.walltime, DAY_S)


class QuotaLedger:
    """Team GPUs held, users' and teams' committed GPU-seconds in the next 24 h, urgent holdings."""

    def __init__(self, state: ClusterState, now: float) -> None:
        self.state = state
        self.config: PolicyConfig = state.config
        self.now = now
        self.horizon = now + DAY_S
        self.team_gpus: dict[str, float] = {}
        self.user_committed: dict[str, float] = {}
        self.team_urgent_gpus: dict[str, float] = {}
        self.team_urgent_committed: dict[str, float] = {}
        for alloc in state.running:
            self._add(alloc, sign=1)
        self.preempted: set[str] = set()
        self._index: dict[tuple[str, str], list[Allocation]] | None = None
        self._started_by: dict[tuple[str, str], list[Allocation]] = {}
        self._cache: dict[tuple, list] = {}

    # -- totals --------------------------------------------------------------------

    def _remaining(self, alloc: Allocation) -> float:
        return alloc.gpus * max(0.0, min(alloc.expected_end, self.horizon) - self.now)

    def _add(self, alloc: Allocation, sign: int) -> None:
        g = alloc.gpus * sign
        rem = self._remaining(alloc) * sign
        self.team_gpus[alloc.team] = self.team_gpus.get(alloc.team, 0.0) + g
        self.user_committed[alloc.user] = self.user_committed.get(alloc.user, 0.0) + rem
        if alloc.priority_class == "urgent":
            self.team_urgent_gpus[alloc.team] = self.team_urgent_gpus.get(alloc.team, 0.0) + g
            self.team_urgent_committed[alloc.team] = self.team_urgent_committed.get(alloc.team, 0.0) + rem

    def started(self, alloc: Allocation) -> None:
        self._add(alloc, sign=1)
        self._started_by.setdefault(("team", alloc.team), []).append(alloc)
        self._started_by.setdefault(("user", alloc.user), []).append(alloc)

    def preempted_alloc(self, alloc: Allocation) -> None:
        self._add(alloc, sign=-1)
        self.preempted.add(alloc.job_id)

    # -- policy lookups --------------------------------------------------------------

    def team_policy(self, team: str) -> TeamPolicy:
        return self.state.teams.get(team, self.config.default_team)

    def user_quota_s(self, tp: TeamPolicy) -> float | None:
        hours = (
            tp.user_gpu_hours_per_day if tp.user_gpu_hours_per_day is not None else self.config.user_gpu_hours_per_day
        )
        return None if hours is None else hours * 3600.0

    def over_quota(self, user: str, team: str) -> bool:
        """Whether ``user`` has used up the daily GPU-hour quota that applies in ``team``."""
        quota = self.user_quota_s(self.team_policy(team))
        return quota is not None and self.state.user_usage_24h.get(user, 0.0) + EPS >= quota

    def over_quota_jobs(self) -> set[str]:
        """Running jobs whose user is past the daily quota: they run as preemptible "over quota" work."""
        cache: dict[tuple[str, str], bool] = {}
        out = set()
        for a in self.state.running:
            key = (a.user, a.team)
            if key not in cache:
                cache[key] = self.over_quota(a.user, a.team)
            if cache[key]:
                out.add(a.job_id)
        return out

    def limited(self, tp: TeamPolicy) -> bool:
        """Whether any quota applies to this team's jobs (skips the checks when none does)."""
        return tp.max_gpus is not None or self.user_quota_s(tp) is not None

    def urgent_ok(self, job: JobRequest) -> bool:
        """Whether ``job`` may run as urgent: its team's urgent GPU-hours per day and urgent GPUs allow it."""
        tp = self.team_policy(job.team)
        used = self.state.team_urgent_usage_24h.get(job.team, 0.0) + self.team_urgent_committed.get(job.team, 0.0)
        return (
            used + request_24h(job) <= tp.urgent_gpu_hours_per_day * 3600.0 + EPS
            and self.team_urgent_gpus.get(job.team, 0.0) + job.gpus <= tp.urgent_max_gpus + EPS
        )

    # -- holds -----------------------------------------------------------------------

    def _holdings(self, attr: str, key: str) -> list[Allocation]:
        """Allocations of one team (``attr="team"``) or user held now, incl. this pass's starts."""
        if self._index is None:
            self._index = {}
            for a in self.state.running:
                self._index.setdefault(("team", a.team), []).append(a)
                self._index.setdefault(("user", a.user), []).append(a)
        held = self._index.get((attr, key), []) + self._started_by.get((attr, key), [])
        if self.preempted:
            held = [a for a in held if a.job_id not in self.preempted]
        return held

    def _held_version(self, attr: str, key: str) -> tuple:
        return (attr, key, len(self._started_by.get((attr, key), ())), len(self.preempted))

    def team_free_at(self, team: str, need: float, limit: float) -> float | None:
        """When enough of the team's running GPUs end for ``need`` more to fit under ``limit``."""
        cache_key = self._held_version("team", team)
        allocs = self._cache.get(cache_key)
        if allocs is None:
            allocs = self._cache[cache_key] = sorted(self._holdings("team", team), key=lambda a: a.expected_end)
        in_use = self.team_gpus.get(team, 0.0)
        for a in allocs:
            in_use -= a.gpus
            if in_use + need <= limit + EPS:
                return max(self.now, a.expected_end)
        return None

    def user_free_at(self, user: str, excess: float) -> float | None:
        """When enough of the user's 24 h usage leaves the window to cover ``excess``.

        Past usage leaves at the times ``user_usage_expiry`` gives; what the user's running
        jobs will still use is counted as leaving 24 h after each job's expected end.
        """
        cache_key = self._held_version("user", user)
        expiries = self._cache.get(cache_key)
        if expiries is None:
            expiries = list(self.state.user_usage_expiry.get(user, ()))
            horizon = self.now + DAY_S
            for a in self._holdings("user", user):
                if a.expected_end > self.now:
                    end = min(a.expected_end, horizon)
                    expiries.append((end + DAY_S, a.gpus * (end - self.now)))
            expiries.sort()
            self._cache[cache_key] = expiries
        freed = 0.0
        for at, amount in expiries:
            freed += amount
            if freed + EPS >= excess:
                return max(self.now, at)
        return None

    def block(self, job: JobRequest, tp: TeamPolicy) -> Waiting | None:
        """A ``quota`` hold for ``job`` (with the time it lifts), or None if no quota holds it."""
        if tp.max_gpus is not None:
            in_use = self.team_gpus.get(job.team, 0.0)
            if in_use + job.gpus > tp.max_gpus + EPS:
                until = self.team_free_at(job.team, job.gpus, tp.max_gpus)
                return Waiting(job, "quota", ("team", in_use, tp.max_gpus), until)
        # The daily quota is a consumption budget (like a prepaid allowance): a user who has
        # used it up in the last 24 h runs only as preemptible "over quota" work (the caller
        # decides, ``note[0] == "user"``) until usage rolls out of the window, and such running
        # work is the first preempted. Projecting future use instead would make any job longer
        # than the quota (a three-day training) impossible to run at all. A job that may not
        # be preempted cannot be stopped at the quota, so it starts only if its next 24 h of
        # use fits in what the quota has left.
        quota = self.user_quota_s(tp)
        if quota is not None:
            used = self.state.user_usage_24h.get(job.user, 0.0)
            if used + EPS >= quota:
                until = self.user_free_at(job.user, used - quota + 2 * EPS)
                return Waiting(job, "quota", ("user", used, quota), until)
            if not job.preemptible:
                projected = used + self.user_committed.get(job.user, 0.0) + request_24h(job)
                if projected > quota + EPS:
                    until = self.user_free_at(job.user, projected - quota + 2 * EPS)
                    return Waiting(job, "quota", ("user-np", used, quota), until)
        return None
