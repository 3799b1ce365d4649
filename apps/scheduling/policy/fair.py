"""The ``fair`` policy: multifactor priority, quotas, urgent allowance, preemption,
best-fit placement, EASY-style backfill with reservations, and an ETA for every job.
"""

from __future__ import annotations

import bisect
import heapq
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from .placement import EPS, NodeCapacity, Placer, capacities
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


class _Waiting:
    """A job this pass does not start, and why."""

    __slots__ = ("job", "kind", "note", "until", "cls")

    def __init__(self, job: JobRequest, kind: str, note: str = "", until: float | None = None, cls: str = "") -> None:
        self.job = job
        self.kind = kind  # "never" | "quota" | "resources" | "reserved"
        self.note = note
        self.until = until  # quota: when it frees up; reserved: reserved start
        self.cls = cls  # the class it would run as


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
       factors and priority; jobs are considered urgent-within-allowance first, then by
       priority (ties: older first).
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
        drain: dict[str, float] = {}
        for a in state.running:
            end = max(a.expected_end, now)
            if end > drain.get(a.node, now):
                drain[a.node] = end
        self.placer = Placer(self.caps, drain if self.config.drain_aware else None, now)
        self.counters = _Counters(state, now)
        self.starts: list[Start] = []
        self.started_allocs: list[Allocation] = []
        self.preempted: dict[str, Preemption] = {}
        self.reservations: list[_Reservation] = []
        self.waiting: list[_Waiting] = []
        self.blocked = False  # without backfill nothing passes a blocked job
        self._never_cache: dict[tuple, str | None] = {}
        self._empty_nodes: list[NodeCapacity] | None = None
        self._events: list[tuple[float, str, str, Allocation]] | None = None
        self._index: dict[tuple[str, str], list[Allocation]] | None = None
        self._cache: dict[tuple, list] = {}
        self._started_by: dict[tuple[str, str], list[Allocation]] = {}
        self._fmt_cache: dict[float, str] = {}

    # -- policy lookups --------------------------------------------------------------

    def team_policy(self, team: str) -> TeamPolicy:
        return self.state.teams.get(team, self.config.default_team)

    def user_quota_s(self, tp: TeamPolicy) -> float | None:
        hours = (
            tp.user_gpu_hours_per_day if tp.user_gpu_hours_per_day is not None else self.config.user_gpu_hours_per_day
        )
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

    def prioritise(self) -> list[tuple[float, JobRequest, str, tuple[float, float, float, float]]]:
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
            rows.append((prio, job, cls, (f_share, f_age, f_size, f_class)))
        # Urgent jobs within their allowance form a tier above everyone else; the rest by priority.
        rows.sort(key=lambda r: (r[2] != "urgent", -r[0], r[1].submitted_at, r[1].job_id))
        return rows

    # -- checks --------------------------------------------------------------------

    def _never_static(self, job: JobRequest, tp: TeamPolicy, shape: tuple) -> str | None:
        limit = self.job_limit(tp)
        if limit is not None and job.gpus > limit + EPS:
            return f"asks for {job.gpus:g} GPUs; the per-job limit is {limit:g}"
        if tp.max_gpus is not None and job.gpus > tp.max_gpus + EPS:
            return f"asks for {job.gpus:g} GPUs; team {job.team} may hold at most {tp.max_gpus:g}"
        if self._empty_nodes is None:
            distinct = {(n.gpus, n.cpu_milli, n.memory_mb): n for n in self.state.nodes if n.schedulable}
            self._empty_nodes = [NodeCapacity.of(n, ()) for n in distinct.values()]
        if not any(c.fit(job) is not None for c in self._empty_nodes):
            return f"no schedulable node can ever fit {_gpus_text(job)} with the CPU/RAM asked"
        return None

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
        in_use = self.counters.team_gpus.get(team, 0.0)
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

    def quota_block(self, job: JobRequest, tp: TeamPolicy) -> _Waiting | None:
        c = self.counters
        if tp.max_gpus is not None:
            in_use = c.team_gpus.get(job.team, 0.0)
            if in_use + job.gpus > tp.max_gpus + EPS:
                until = self.team_free_at(job.team, job.gpus, tp.max_gpus)
                return _Waiting(job, "quota", ("team", in_use, tp.max_gpus), until)
        # The daily quota is a consumption budget (like a prepaid allowance): a user who has
        # used it up in the last 24 h starts nothing new until usage rolls out of the window;
        # running jobs are never stopped for it. Projecting future use instead would make
        # any job longer than the quota (a three-day training) impossible to run at all.
        quota = self.user_quota_s(tp)
        if quota is not None:
            used = self.state.user_usage_24h.get(job.user, 0.0)
            if used + EPS >= quota:
                until = self.user_free_at(job.user, used - quota + 2 * EPS)
                return _Waiting(job, "quota", ("user", used, quota), until)
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
            job.job_id,
            job.team,
            job.user,
            node,
            indices,
            share,
            job.gpu_memory_mb,
            job.cpu_milli,
            job.memory_mb,
            cls,
            self.now,
            self.now + job.walltime,
            False,
        )
        self.started_allocs.append(alloc)
        self.counters.add(alloc, sign=1)
        self._started_by.setdefault(("team", alloc.team), []).append(alloc)
        self._started_by.setdefault(("user", alloc.user), []).append(alloc)
        if self._events is not None:
            bisect.insort(self._events, (alloc.expected_end, alloc.node, alloc.job_id, alloc))

    def try_preempt(self, job: JobRequest, cls: str) -> bool:
        """Free room for an urgent job by requeueing the fewest, lowest, most recent jobs."""
        now, min_run = self.now, self.config.preempt_min_runtime_s
        by_node: dict[str, list[Allocation]] = {}
        for a in self.state.running:
            if (
                a.preemptible
                and a.priority_class in VICTIM_CLASSES
                and a.job_id not in self.preempted
                and now - a.started_at >= min_run
            ):
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
                trial.take(
                    victim.gpu_indices, victim.gpu_share, victim.gpu_memory_mb, victim.cpu_milli, victim.memory_mb
                )
                if trial.fit(job) is None:
                    trial.release(victim)
                else:
                    chosen.remove(victim)
            key = (
                len(chosen),
                max(CLASS_RANK[v.priority_class] for v in chosen),
                sum(CLASS_RANK[v.priority_class] for v in chosen),
                -min(v.started_at for v in chosen),
                node,
            )
            if best is None or key < best[0]:
                best = (key, node, chosen)
        if best is None:
            return False
        _, node, chosen = best
        for victim in chosen:
            self.placer.release(victim)
            self.counters.add(victim, sign=-1)
            self.preempted[victim.job_id] = Preemption(
                victim.job_id, f"preempted by urgent job {job.job_id}; resumes from its checkpoint", job.job_id
            )
        self._events = None
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
        failed = self.placer.failed  # the same set object all pass (cleared in place)
        waiting = self.waiting
        never_cache = self._never_cache
        team_info: dict[str, tuple[TeamPolicy, bool]] = {}
        for _prio, job, cls, _factors in rows:
            info = team_info.get(job.team)
            if info is None:
                tp = self.team_policy(job.team)
                limited = tp.max_gpus is not None or self.user_quota_s(tp) is not None
                info = team_info[job.team] = (tp, limited)
            tp, limited = info
            shape = (job.gpus, job.gpu_models, job.gpu_memory_mb, job.cpu_milli, job.memory_mb)
            key = (shape, job.team)
            if key in never_cache:
                never = never_cache[key]
            else:
                never = never_cache[key] = self._never_static(job, tp, shape)
            if never is not None:
                waiting.append(_Waiting(job, "never", never, None, cls))
                continue
            if limited:
                blocked = self.quota_block(job, tp)
                if blocked is not None:
                    blocked.cls = cls
                    waiting.append(blocked)
                    continue
            if self.blocked or shape in failed:  # on a full cluster: nothing of this shape fits
                waiting.append(_Waiting(job, "resources", "", None, cls))
                continue
            if cls == "urgent" and not self.urgent_ok(job):
                cls = "high"  # an earlier urgent job in this pass used the allowance
            placed = self.placer.place(job, self.reservation_ok(job) if self.reservations else None)
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
                    waiting.append(_Waiting(job, "reserved", "", res.at, cls))
                    continue
            waiting.append(_Waiting(job, "resources", "", None, cls))
        queue, wake_at = self.explain(rows)
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

    def explain(self, rows) -> tuple[tuple[QueueEntry, ...], float | None]:
        """ETA, position and reason for every waiting job, in one sweep in priority order.

        ETAs come from list scheduling on the pooled GPUs: each GPU is a slot free at the
        end of what runs on it; each waiting job, in order, takes the earliest slots it
        needs (a fractional job one slot for ``walltime × share``, area-preserving).
        Reserved jobs start at their reservation; quota-held jobs not before their quota
        frees up. Node boundaries and GPU models are ignored beyond the reservations.
        """
        now = self.now
        only = self.state.explain_only
        info = {job.job_id: (prio, factors) for prio, job, _, factors in rows}
        slots = self.gpu_slots()
        n_slots = len(slots)
        reserved_node = {r.job.job_id: r.node for r in self.reservations}
        entries: list[QueueEntry] = []
        wake_at: float | None = None
        heappop, heappush, heapreplace = heapq.heappop, heapq.heappush, heapq.heapreplace
        ahead = 0
        position = 0
        for w in self.waiting:
            job = w.job
            position += 1
            eta: float | None = None
            kind = w.kind
            if kind != "never":
                t0: float | None = now
                if kind == "quota":
                    t0 = w.until
                    if t0 is not None and t0 > now and (wake_at is None or t0 < wake_at):
                        wake_at = t0
                gpus = job.gpus
                if t0 is not None and gpus <= n_slots:
                    if gpus <= 1:
                        start = slots[0]
                        if start < t0:
                            start = t0
                        if kind == "reserved":
                            start = w.until
                        heapreplace(slots, start + job.walltime * gpus)
                    else:
                        n = int(round(gpus))
                        popped = [heappop(slots) for _ in range(n)]
                        start = max(t0, popped[-1])
                        if kind == "reserved":
                            start = w.until
                        end = start + job.walltime
                        for _ in range(n):
                            heappush(slots, end)
                    eta = start
            if only is None or job.job_id in only:
                prio, f = info[job.job_id]
                cls = w.cls
                factors = {"fairshare": f[0], "age": f[1], "size": f[2], "class": f[3]}
                entries.append(
                    QueueEntry(
                        job.job_id,
                        position,
                        prio,
                        factors,
                        eta,
                        self.reason(w, cls, ahead, eta),
                        reserved_node.get(job.job_id),
                    )
                )
            if kind == "resources" or kind == "reserved":
                ahead += 1
        return tuple(entries), wake_at

    def fmt(self, t: float) -> str:
        text = self._fmt_cache.get(t)
        if text is None:
            text = self._fmt_cache[t] = fmt_time(t, self.now)
        return text

    def reason(self, w: _Waiting, cls: str, ahead: int, eta: float | None) -> str:
        job, fmt_time = w.job, self.fmt
        if w.kind == "never":
            return w.note
        if w.kind == "quota":
            if w.note[0] == "team":
                _, in_use, limit = w.note
                text = f"over team quota ({in_use:g} of {limit:g} GPUs in use)"
            else:
                _, used, quota = w.note
                text = f"over daily GPU-hour quota ({used / 3600:.1f} of {quota / 3600:g} used in 24 h)"
            text += f" until {fmt_time(w.until)}" if w.until is not None else ""
        elif w.kind == "reserved":
            text = f"waiting for {_gpus_text(job)}; reserved; expected {fmt_time(w.until)}"
        else:
            text = f"waiting for {_gpus_text(job)}"
            if ahead:
                text = f"behind {ahead} higher-priority job{'s' if ahead != 1 else ''}; " + text
            if eta is not None:
                text += f"; expected {fmt_time(eta)}"
        if job.priority_class == "urgent" and cls != "urgent":
            text += " (team's urgent allowance used up: runs as high)"
        return text


def plan_fair(state: ClusterState, now: float) -> Plan:
    return FairPlanner(state, now).run()
