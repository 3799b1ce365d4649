"""The ``fair`` policy: multifactor priority, quotas, urgent allowance, preemption,
best-fit placement, EASY-style backfill with reservations, and an ETA for every job.
"""

from __future__ import annotations

import bisect
import heapq
import math
import time
from dataclasses import dataclass
from typing import Callable

from .placement import EPS, NodeCapacity, Placer, capacities, shape_of
from .priority import CLASS_FACTOR, CLASS_RANK, fair_tree
from .types import (
    DAY_S,
    Allocation,
    ClusterState,
    JobRequest,
    Plan,
    PolicyConfig,
    Preemption,
    QueueEntry,
    Start,
    TeamPolicy,
)

VICTIM_CLASSES = ("low", "medium")


@dataclass
class _Reservation:
    job: JobRequest
    node: str
    at: float
    cap_at: NodeCapacity  # the node's capacity at ``at``, before the reserved job takes it
    indices: tuple[int, ...]
    share: float


@dataclass
class _Waiting:
    job: JobRequest
    kind: str  # "never" | "quota" | "resources" | "reserved"
    note: str = ""
    until: float | None = None  # quota: when it frees up; reserved: reserved start


def fmt_time(t: float, now: float) -> str:
    """``14:20 UTC`` within a day of ``now``, else ``2026-12-01 14:20 UTC``."""
    pattern = "%H:%M UTC" if t - now < DAY_S else "%Y-%m-%d %H:%M UTC"
    return time.strftime(pattern, time.gmtime(t))


def _gpus_text(job: JobRequest) -> str:
    if job.gpus < 1:
        what = f"{job.gpus:g} of a GPU"
    else:
        what = f"{job.gpus:g} GPU{'s' if job.gpus != 1 else ''} on one node"
    if job.gpu_models:
        what += f" ({'/'.join(job.gpu_models)})"
    return what


class _Counters:
    """Per-team and per-user totals that quotas and the urgent allowance are checked against."""

    def __init__(self, state: ClusterState, now: float) -> None:
        self.now = now
        self.horizon = now + DAY_S
        self.team_gpus: dict[str, float] = {}
        self.user_committed: dict[str, float] = {}
        self.team_urgent_gpus: dict[str, float] = {}
        self.team_urgent_committed: dict[str, float] = {}
        for alloc in state.running:
            self.add(alloc, sign=1)

    def _remaining(self, alloc: Allocation) -> float:
        return alloc.gpus * max(0.0, min(alloc.expected_end, self.horizon) - self.now)

    def add(self, alloc: Allocation, sign: int) -> None:
        g = alloc.gpus * sign
        rem = self._remaining(alloc) * sign
        self.team_gpus[alloc.team] = self.team_gpus.get(alloc.team, 0.0) + g
        self.user_committed[alloc.user] = self.user_committed.get(alloc.user, 0.0) + rem
        if alloc.priority_class == "urgent":
            self.team_urgent_gpus[alloc.team] = self.team_urgent_gpus.get(alloc.team, 0.0) + g
            self.team_urgent_committed[alloc.team] = self.team_urgent_committed.get(alloc.team, 0.0) + rem


def _request_24h(job: JobRequest) -> float:
    """GPU-seconds the job may use in the next 24 h (what quotas are checked against)."""
    return job.gpus * min(job.walltime, DAY_S)


class FairPlanner:
    """One planning pass. Use :func:`plan_fair`; the class only keeps the state of the pass.

    1. Free capacity per node from running allocations; team/user totals for quotas.
    2. Fair-share factor per (team, user) by Fair Tree over decayed usage.
    3. Each queued job's class (urgent beyond its team's allowance counts as high), its
       factors and priority; jobs are considered in priority order (ties: older first).
    4. For each job in order: reject what can never start (per-job limit, no node large
       enough, more GPU-hours than the daily quota); hold what is over a quota; otherwise
       place it best-fit now if that delays no reservation; an urgent job that does not
       fit may preempt low/medium jobs; the first ``config.reservations`` jobs that still
       cannot start get a reservation (node and time) from running jobs' expected ends.
    5. One sweep over the waiting jobs in order gives every one an ETA (reserved jobs
       their reservation; others by list-scheduling on the pooled GPUs) and a reason.
    """

    def __init__(self, state: ClusterState, now: float) -> None:
        self.state = state
        self.now = now
        self.config: PolicyConfig = state.config
        self.caps = capacities(state.nodes, state.running)
        self.placer = Placer(self.caps)
        self.counters = _Counters(state, now)
        self.starts: list[Start] = []
        self.started_allocs: list[Allocation] = []
        self.preempted: dict[str, Preemption] = {}
        self.reservations: list[_Reservation] = []
        self.waiting: list[_Waiting] = []
        self.blocked = False  # without backfill nothing passes a blocked job
        self._never_fit: dict[tuple, bool] = {}
        self._events: list[tuple[float, str, str, Allocation]] | None = None
        self._team_running: dict[str, list[Allocation]] | None = None

    # -- policy lookups --------------------------------------------------------------

    def team_policy(self, team: str) -> TeamPolicy:
        return self.state.teams.get(team, self.config.default_team)

    def user_quota_s(self, tp: TeamPolicy) -> float | None:
        hours = tp.user_gpu_hours_per_day if tp.user_gpu_hours_per_day is not None else self.config.user_gpu_hours_per_day
        return None if hours is None else hours * 3600.0

    def job_limit(self, tp: TeamPolicy) -> float | None:
        return tp.max_gpus_per_job if tp.max_gpus_per_job is not None else self.config.max_gpus_per_job

    def urgent_ok(self, job: JobRequest) -> bool:
        tp = self.team_policy(job.team)
        c = self.counters
        used = self.state.team_urgent_usage_24h.get(job.team, 0.0) + c.team_urgent_committed.get(job.team, 0.0)
        return (
            used + _request_24h(job) <= tp.urgent_gpu_hours_per_day * 3600.0 + EPS
            and c.team_urgent_gpus.get(job.team, 0.0) + job.gpus <= tp.urgent_max_gpus + EPS
        )

    # -- priorities ----------------------------------------------------------------

    def prioritise(self) -> list[tuple[float, JobRequest, str, dict[str, float]]]:
        state, config, now = self.state, self.config, self.now
        pairs = {(j.team, j.user) for j in state.queued}
        pairs.update(state.usage.keys())
        fairshare = fair_tree(pairs, state.usage, state.teams, config.default_team)
        wf, wa, ws, wc = config.weight_fairshare, config.weight_age, config.weight_size, config.weight_class
        age_cap = config.age_cap_s
        size_norm = 1.0 / math.log1p(config.size_cap_gpu_hours)
        urgent_cache: dict[str, bool] = {}
        rows = []
        for job in state.queued:
            cls = job.priority_class if job.priority_class in CLASS_FACTOR else "medium"
            if cls == "urgent":
                ok = urgent_cache.get(job.job_id)
                if ok is None:
                    ok = urgent_cache[job.job_id] = self.urgent_ok(job)
                if not ok:
                    cls = "high"
            f_share = fairshare.get((job.team, job.user), 1.0)
            waited = now - job.submitted_at
            f_age = 0.0 if waited <= 0 else (1.0 if waited >= age_cap else waited / age_cap)
            f_size = 1.0 - math.log1p(job.gpus * job.walltime / 3600.0) * size_norm
            if f_size < 0.0:
                f_size = 0.0
            f_class = CLASS_FACTOR[cls]
            prio = wf * f_share + wa * f_age + ws * f_size + wc * f_class
            factors = {"fairshare": f_share, "age": f_age, "size": f_size, "class": f_class}
            rows.append((prio, job, cls, factors))
        rows.sort(key=lambda r: (-r[0], r[1].submitted_at, r[1].job_id))
        return rows

    # -- checks --------------------------------------------------------------------

    def never_reason(self, job: JobRequest, tp: TeamPolicy) -> str | None:
        limit = self.job_limit(tp)
        if limit is not None and job.gpus > limit + EPS:
            return f"asks for {job.gpus:g} GPUs; the per-job limit is {limit:g}"
        if tp.max_gpus is not None and job.gpus > tp.max_gpus + EPS:
            return f"asks for {job.gpus:g} GPUs; team {job.team} may hold at most {tp.max_gpus:g}"
        shape = shape_of(job)
        fits = self._never_fit.get(shape)
        if fits is None:
            fits = self._never_fit[shape] = any(
                NodeCapacity.of(n, ()).fit(job) is not None for n in self.state.nodes if n.schedulable
            )
        if not fits:
            return f"no schedulable node can ever fit {_gpus_text(job)} with the CPU/RAM asked"
        quota = self.user_quota_s(tp)
        if quota is not None and _request_24h(job) > quota + EPS:
            return (f"needs {_request_24h(job) / 3600:.1f} GPU-hours within 24 h, more than the "
                    f"daily quota of {quota / 3600:g}; lower its timeout or GPUs")
        return None

    def team_free_at(self, team: str, need: float, limit: float) -> float | None:
        """When enough of the team's running GPUs end for ``need`` more to fit under ``limit``."""
        if self._team_running is None:
            self._team_running = {}
            for a in self.state.running:
                if a.job_id not in self.preempted:
                    self._team_running.setdefault(a.team, []).append(a)
        allocs = sorted(self._team_running.get(team, []) + [a for a in self.started_allocs if a.team == team],
                        key=lambda a: a.expected_end)
        in_use = self.counters.team_gpus.get(team, 0.0)
        for a in allocs:
            in_use -= a.gpus
            if in_use + need <= limit + EPS:
                return max(self.now, a.expected_end)
        return None

    def user_free_at(self, user: str, excess: float) -> float | None:
        """When enough of the user's 24 h usage leaves the window to cover ``excess``."""
        expiries = self.state.user_usage_expiry.get(user)
        if not expiries:
            return None
        freed = 0.0
        for at, amount in sorted(expiries):
            freed += amount
            if freed + EPS >= excess:
                return max(self.now, at)
        return None

    def quota_block(self, job: JobRequest, tp: TeamPolicy) -> _Waiting | None:
        c = self.counters
        if tp.max_gpus is not None:
            in_use = c.team_gpus.get(job.team, 0.0)
            if in_use + job.gpus > tp.max_gpus + EPS:
                until = self.team_free_at(job.team, job.gpus, tp.max_gpus)
                note = f"over team quota ({in_use:g} of {tp.max_gpus:g} GPUs in use)"
                return _Waiting(job, "quota", note, until)
        quota = self.user_quota_s(tp)
        if quota is not None:
            used = self.state.user_usage_24h.get(job.user, 0.0)
            committed = c.user_committed.get(job.user, 0.0)
            excess = used + committed + _request_24h(job) - quota
            if excess > EPS:
                until = self.user_free_at(job.user, excess)
                note = (f"over daily GPU-hour quota ({used / 3600:.1f} used + {committed / 3600:.1f} "
                        f"running + {_request_24h(job) / 3600:.1f} asked > {quota / 3600:g} in 24 h)")
                return _Waiting(job, "quota", note, until)
        return None

    # -- starting ------------------------------------------------------------------

    def reservation_ok(self, job: JobRequest) -> Callable[[str, tuple[int, ...], float], bool]:
        end = self.now + job.walltime

        def allowed(node: str, indices: tuple[int, ...], share: float) -> bool:
            touched = [r for r in self.reservations if r.node == node and end > r.at]
            for r in touched:
                trial = r.cap_at.copy()
                trial.take(indices, share, job.gpu_memory_mb, job.cpu_milli, job.memory_mb)
                if trial.fit(r.job) is None:
                    return False
            for r in touched:
                r.cap_at.take(indices, share, job.gpu_memory_mb, job.cpu_milli, job.memory_mb)
            return True

        return allowed

    def start(self, job: JobRequest, cls: str, node: str, indices: tuple[int, ...], share: float) -> None:
        self.starts.append(Start(job.job_id, node, indices, share, cls))
        alloc = Allocation(
            job.job_id, job.team, job.user, node, indices, share, job.gpu_memory_mb,
            job.cpu_milli, job.memory_mb, cls, self.now, self.now + job.walltime, False,
        )
        self.started_allocs.append(alloc)
        self.counters.add(alloc, sign=1)
        if self._events is not None:
            bisect.insort(self._events, (alloc.expected_end, alloc.node, alloc.job_id, alloc))

    def try_preempt(self, job: JobRequest, cls: str) -> bool:
        """Free room for an urgent job by requeueing the fewest, lowest, most recent jobs."""
        now, min_run = self.now, self.config.preempt_min_runtime_s
        by_node: dict[str, list[Allocation]] = {}
        for a in self.state.running:
            if (a.preemptible and a.priority_class in VICTIM_CLASSES and a.job_id not in self.preempted
                    and now - a.started_at >= min_run):
                by_node.setdefault(a.node, []).append(a)
        best = None
        for node in sorted(by_node):
            cap = self.caps.get(node)
            if cap is None or not cap.node.schedulable:
                continue
            trial = cap.copy()
            chosen: list[Allocation] = []
            for victim in sorted(by_node[node], key=lambda a: (CLASS_RANK[a.priority_class], -a.started_at, a.job_id)):
                trial.release(victim)
                chosen.append(victim)
                if trial.fit(job) is not None:
                    break
            else:
                continue
            # Drop victims the job turns out not to need (greedy can over-pick).
            for victim in list(chosen[:-1]):
                trial.take(victim.gpu_indices, victim.gpu_share, victim.gpu_memory_mb,
                           victim.cpu_milli, victim.memory_mb)
                if trial.fit(job) is None:
                    trial.release(victim)
                else:
                    chosen.remove(victim)
            key = (len(chosen), max(CLASS_RANK[v.priority_class] for v in chosen),
                   sum(CLASS_RANK[v.priority_class] for v in chosen), -min(v.started_at for v in chosen), node)
            if best is None or key < best[0]:
                best = (key, node, chosen)
        if best is None:
            return False
        _, node, chosen = best
        for victim in chosen:
            self.placer.release(victim)
            self.counters.add(victim, sign=-1)
            self.preempted[victim.job_id] = Preemption(
                victim.job_id, f"preempted by urgent job {job.job_id}; resumes from its checkpoint", job.job_id)
        self._events = None
        self._team_running = None
        placed = self.placer.place(job, lambda n, i, s: n == node)
        if placed is None:  # cannot happen: the trial fitted
            return False
        self.start(job, cls, *placed)
        return True

    # -- reservations --------------------------------------------------------------

    def release_events(self) -> list[tuple[float, str, str, Allocation]]:
        if self._events is None:
            now = self.now
            allocs = [a for a in self.state.running if a.job_id not in self.preempted] + self.started_allocs
            self._events = sorted((max(a.expected_end, now), a.node, a.job_id, a) for a in allocs)
        return self._events

    def reserve(self, job: JobRequest) -> _Reservation | None:
        """Earliest (time, node) at which ``job`` fits as running jobs end, earlier reservations held."""
        clones: dict[str, NodeCapacity] = {}

        def clone(node: str) -> NodeCapacity:
            c = clones.get(node)
            if c is None:
                c = clones[node] = self.caps[node].copy()
                for r in self.reservations:
                    if r.node == node:
                        c.take(r.indices, r.share, r.job.gpu_memory_mb, r.job.cpu_milli, r.job.memory_mb)
            return c

        for at, node, _, alloc in self.release_events():
            if node not in self.caps:
                continue
            c = clone(node)
            c.release(alloc)
            fit = c.fit(job)
            if fit is not None:
                res = _Reservation(job, node, at, c.copy(), fit[0], fit[1])
                self.reservations.append(res)
                return res
        return None

    # -- the pass ------------------------------------------------------------------

    def run(self) -> Plan:
        config = self.config
        rows = self.prioritise()
        classes: dict[str, str] = {}
        for prio, job, cls, factors in rows:
            classes[job.job_id] = cls
            tp = self.team_policy(job.team)
            never = self.never_reason(job, tp)
            if never is not None:
                self.waiting.append(_Waiting(job, "never", never))
                continue
            blocked = self.quota_block(job, tp)
            if blocked is not None:
                self.waiting.append(blocked)
                continue
            if self.blocked:
                self.waiting.append(_Waiting(job, "resources"))
                continue
            if cls == "urgent" and not self.urgent_ok(job):
                cls = classes[job.job_id] = "high"  # an earlier urgent job in this pass used the allowance
            allowed = self.reservation_ok(job) if self.reservations else None
            placed = self.placer.place(job, allowed)
            if placed is not None:
                self.start(job, cls, *placed)
                continue
            if cls == "urgent" and config.preemption and self.try_preempt(job, cls):
                continue
            if not config.backfill:
                self.blocked = True
            if len(self.reservations) < config.reservations:
                res = self.reserve(job)
                if res is not None:
                    self.waiting.append(_Waiting(job, "reserved", until=res.at))
                    continue
            self.waiting.append(_Waiting(job, "resources"))
        queue, wake_at = self.explain(rows, classes)
        return Plan(
            starts=tuple(self.starts),
            preemptions=tuple(self.preempted[k] for k in sorted(self.preempted)),
            queue=queue,
            wake_at=wake_at,
        )

    def gpu_slots(self) -> list[float]:
        """When each schedulable GPU is next free, for the pooled ETA sweep."""
        now = self.now
        ends: dict[tuple[str, int], list[float]] = {}
        for a in self.state.running:
            if a.job_id in self.preempted:
                continue
            for i in a.gpu_indices:
                ends.setdefault((a.node, i), []).append(max(a.expected_end, now))
        for a in self.started_allocs:
            for i in a.gpu_indices:
                ends.setdefault((a.node, i), []).append(a.expected_end)
        slots = []
        for node in self.state.nodes:
            if not node.schedulable:
                continue
            cap = self.caps[node.name]
            for g in node.gpus:
                e = ends.get((node.name, g.index))
                if not e:
                    slots.append(now)
                elif cap.gpu_free[g.index] > EPS:
                    slots.append(min(e))  # shared GPU with room: free enough at the first end
                else:
                    slots.append(max(e))
        heapq.heapify(slots)
        return slots

    def explain(self, rows, classes: dict[str, str]) -> tuple[tuple[QueueEntry, ...], float | None]:
        """ETA, position and reason for every waiting job, in one sweep in priority order."""
        now = self.now
        info = {job.job_id: (prio, requested_cls, factors) for prio, job, requested_cls, factors in rows}
        slots = self.gpu_slots()
        reserved_node = {r.job.job_id: r.node for r in self.reservations}
        entries: list[QueueEntry] = []
        wake_at: float | None = None
        heappop, heappush = heapq.heappop, heapq.heappush
        ahead = 0
        for w in self.waiting:
            job = w.job
            prio, _, factors = info[job.job_id]
            eta: float | None
            if w.kind == "never":
                eta = None
            else:
                t0 = now
                if w.kind == "quota":
                    t0 = w.until if w.until is not None else None
                    if w.until is not None and w.until > now and (wake_at is None or w.until < wake_at):
                        wake_at = w.until
                if t0 is None:
                    eta = None
                else:
                    n = 1 if job.gpus < 1 else int(round(job.gpus))
                    if n > len(slots):
                        eta = None
                    else:
                        popped = [heappop(slots) for _ in range(n)]
                        start = max(t0, popped[-1])
                        if w.kind == "reserved":
                            start = w.until
                        run = job.walltime * (job.gpus if job.gpus < 1 else 1.0)
                        for _ in range(n):
                            heappush(slots, start + run)
                        eta = start
            cls = classes[job.job_id]
            reason = self.reason(w, cls, ahead, eta)
            entries.append(QueueEntry(job.job_id, len(entries) + 1, prio, factors, eta, reason,
                                      reserved_node.get(job.job_id)))
            if w.kind != "never":
                ahead += 1
        return tuple(entries), wake_at

    def reason(self, w: _Waiting, cls: str, ahead: int, eta: float | None) -> str:
        job, now = w.job, self.now
        if w.kind == "never":
            return w.note
        if w.kind == "quota":
            text = w.note + (f" until {fmt_time(w.until, now)}" if w.until is not None else "")
        elif w.kind == "reserved":
            text = f"waiting for {_gpus_text(job)}; reserved; expected {fmt_time(w.until, now)}"
        else:
            text = f"waiting for {_gpus_text(job)}"
            if ahead:
                text = f"behind {ahead} higher-priority job{'s' if ahead != 1 else ''}; " + text
            if eta is not None:
                text += f"; expected {fmt_time(eta, now)}"
        if job.priority_class == "urgent" and cls != "urgent":
            text += " (team's urgent allowance used up: runs as high)"
        return text


def plan_fair(state: ClusterState, now: float) -> Plan:
    return FairPlanner(state, now).run()
