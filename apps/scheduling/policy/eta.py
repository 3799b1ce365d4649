"""Estimated start times with a range: forward simulation at the head, coarse below.

An ETA that assumes nothing changes after this pass is too early whenever better jobs
keep arriving (the drift Slurm's ``squeue --start`` has). So:

1. **Head of the queue** (the first ``config.eta_head`` waiting jobs): the plan is run
   forward, event by event, with the real :class:`~.placement.Placer` (drain-aware best
   fit; fragmentation scoring left out for speed) on copies of the nodes' capacities: running jobs end at their expected ends, waiting jobs start in
   priority order where they fit (EASY-style: a job may pass the first blocked one only
   where it does not delay it), quota-held jobs not before their quota frees. This is
   done in ``config.eta_scenarios`` scenarios; each draws every runtime's error
   (lognormal, ``config.eta_runtime_sigma``) and an inflow of new jobs (a Poisson stream
   at the rate of ``state.inflow``, each a copy of a recent arrival) that join the
   queue at their own priority and overtake whom they outrank. Point = median start over
   the scenarios, range = their P10-P90, widened by ``config.eta_range_widen``. A scenario
   stops after ``config.eta_max_steps`` events; a job one has not started by then gets the
   coarse range (2.), but never earlier than where the scenarios stopped plus the pooled
   sweep's wait from there (:meth:`ForwardSim.after_budget`), so never before a start a
   scenario made for a job ahead of it. With ``config.eta_after_budget_stretch`` off, that
   coarse range leaves out the inflow stretch (the sweep's wait from now as it is).
2. **Below the head**: the pooled list-scheduling sweep (every GPU a slot; node
   boundaries ignored), stretched by the higher-priority inflow — with inflow of
   ``λ`` GPU-seconds per second outranking a job on ``G`` GPUs, waiting takes
   ``1 / (1 - λ/G)`` times longer; not with ``config.eta_below_head_stretch`` off — and
   given the head's relative spread as its range;
   then carried on from the head's last job of the same shape (:meth:`EtaModel.carry_from`):
   each wait scaled by that job's forward wait over its coarse one (where larger, at most
   ``CARRY_RATIO_MAX``, the rest added), so a shape's line keeps its order across the seam.

Deterministic: scenarios use a ``random.Random`` with a fixed seed (the same draws every
pass, so an ETA moves when the state does, not with sampling noise), and every input is
taken in a sorted order, so the same state gives the same ETAs.
"""

from __future__ import annotations

import bisect
import copy
import heapq
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter, itemgetter

from .placement import EPS, NodeCapacity, Placer, Target
from .priority import arrival_priorities
from .types import Allocation, ClusterState, JobRequest, runtime_limit

EtaRange = tuple[float, float, float]  # point, low, high
# Lognormal sigma of a runtime that rests on the stated default (no estimate at all): such a
# job may well take a tenth or ten times as long, so its end is drawn at least this widely.
# (Leaving it undrawn, as at first, gave a new install's queue ranges of zero width.)
UNKNOWN_RUNTIME_SIGMA = 1.0
# The most a wait below the head is multiplied by to carry on from the head's last job
# (EtaModel.carry_from); the rest of that job's excess is added. Above the runtimes' own bias
# (the mean of a lognormal error over its median: e^(σ²/2), 1.65 at σ = 1) with room; on the
# 4x8 seed-1 replay the carried model waits were 1.005-1.97 times the coarse ones (no cap).
CARRY_RATIO_MAX = 3.0
_NO_CARRY = ((1.0, 0.0), (1.0, 0.0), (1.0, 0.0))


@dataclass(slots=True)
class _Pending:
    rank: tuple  # sort key: lower starts first
    job: JobRequest
    t0: float  # not before (quota frees, arrival time, reservation)
    interest: bool  # its ETA is wanted
    walltime: float  # in this scenario
    started: bool = False  # in this scenario (ForwardSim.run drops it from the order)


def _alloc_of(job: JobRequest, node: str, indices: tuple[int, ...], share: float, t: float, end: float) -> Allocation:
    """``Allocation(job_id, team, user, node, indices, share, GPU memory, CPU, RAM, "", t, end)``
    without the frozen dataclass's ``__init__`` (sixteen ``object.__setattr__`` calls): one per
    start in every scenario, ~500 a pass. Every field is set, the defaults as the class has
    them (tests/scheduling checks it against ``Allocation``)."""
    alloc = _new(Allocation)
    _set(
        alloc,
        "__dict__",
        {
            "job_id": job.job_id,
            "team": job.team,
            "user": job.user,
            "node": node,
            "gpu_indices": indices,
            "gpu_share": share,
            "gpu_memory_mb": job.gpu_memory_mb,
            "cpu_milli": job.cpu_milli,
            "memory_mb": job.memory_mb,
            "priority_class": "",
            "started_at": t,
            "expected_end": end,
            "preemptible": False,
            "attained_s": 0.0,
            "preemptions": 0,
            "estimated": True,
            "ends_by": math.inf,
        },
    )
    return alloc


_new = object.__new__
_set = object.__setattr__
_end_of = itemgetter(0)


class ForwardSim:
    """One scenario of the head of the queue run forward (see the module docstring).

    Running allocations are kept in one list sorted by end time (a cursor marks those
    already ended), so the blocked job's shadow walks only the next few ends.
    """

    def __init__(
        self,
        caps: Mapping[str, NodeCapacity],
        holding: Iterable[Allocation],
        drain: Mapping[str, float] | None,
        now: float,
        max_steps: int,
        events: list[tuple[float, int, Allocation]] | None = None,
    ) -> None:
        """``events``: instead of ``holding``, its (end, sequence, allocation) triples already
        sorted, on schedulable nodes only (:meth:`EtaModel.head` draws the ends itself)."""
        self.caps = {name: cap.copy() for name, cap in caps.items() if cap.node.schedulable}
        # The real placer (drain-aware, best fit); fragmentation scoring is left out here for speed.
        self.placer = Placer(self.caps, dict(drain) if drain is not None else None, now)
        self.cursor = 0
        if events is None:
            events = []
            seq = 0
            for a in holding:
                if a.node in self.caps:
                    seq += 1
                    events.append((max(a.expected_end, now), seq, a))
            events.sort()  # (end, sequence): the sequence is unique, allocations are never compared
        self.events = events
        self.seq = len(events)  # also the version of the capacities: only a start (push) adds to it
        self.now = now
        self.max_steps = max_steps
        # The last shadow: (shape, version, the event it found or None, answer, whether the
        # shape fitted nowhere when it was walked: ``Placer.failed``, as run() calls it).
        self._shadow: tuple | None = None
        self._seq0 = self.seq
        # (node, end, whole GPUs only) of every start, in order: version - _seq0 indexes it
        self._pushed: list[tuple[str, float, bool]] = []
        # Where run() used up its step budget: (the simulated time, what still waited, in order)
        self.ran_out: tuple[float, list[_Pending]] | None = None

    def push(self, end: float, alloc: Allocation) -> None:
        self._pushed.append((alloc.node, end, alloc.gpu_share == 1.0))
        self.seq += 1
        # (end, sequence): the sequence is unique, allocations are never compared
        bisect.insort(self.events, (end, self.seq, alloc), lo=self.cursor)

    def shadow(self, job: JobRequest) -> tuple[str, float] | None:
        """(node, time) at which a blocked ``job`` first fits as running jobs end (EASY's shadow).

        The walk releases events from the cursor on copies of the nodes. Without a start
        since the last walk for the same shape, the answer is the same as long as the event
        it found has not been released yet: the capacities differ only by the events
        released since, which that walk released in the same order on its copies.
        """
        shape = job.shape_id
        memo = self._shadow
        events = self.events
        cursor = self.cursor
        if memo is not None and memo[0] == shape:
            _, version, found, answer, blocked = memo
            # The event found is still ahead: events are sorted by (end, unique sequence), so
            # it is at or after the cursor exactly when the cursor's event sorts no later (a
            # start inserted before it moves its index, not its key).
            ahead = found is not None and cursor < len(events) and events[cursor] <= found
            if version == self.seq and (found is None or ahead):
                return answer
            if ahead:
                # Starts since: the answer stands if each one either ran on another node than
                # the one found and ends no earlier than the event found, or took whole GPUs
                # and ends before it (anywhere). Capacity only shrank on a start's node while
                # it runs, and fit() is monotone in capacity (rounding too: round(x, 6) is),
                # so no event before its end fits there now; a whole-GPU start given back
                # restores its node's copy exactly (each of its GPUs goes 1.0 -> 0.0 -> 1.0,
                # integers for memory and CPU), so from its end on the walk sees what the
                # last walk saw, where it found no fit (that walk checked the node after each
                # of its events, and before any, the shape fitted nowhere: ``blocked``); every
                # other node's copies are as before. A fractional start ending before the
                # event found may not round back exactly: walk again.
                node, at = answer
                for n, end, whole in self._pushed[version - self._seq0 :]:
                    if end < at:
                        if not (whole and blocked):
                            break
                    elif n == node:
                        break
                else:
                    self._shadow = (shape, self.seq, found, answer, blocked)
                    return answer
        copies: dict[str, NodeCapacity] = {}
        caps = self.caps
        # fit() says no at once to a whole-GPU job on a node with too few idle GPUs: that
        # check first, inline (most events free a GPU on a node still far from enough).
        whole = job.gpus - EPS if job.gpus >= 1 else -1.0
        # For a whole-GPU shape a node is copied and its events released on the copy only
        # once they could give it enough idle GPUs: a release turns at most as many GPUs
        # idle as it names, so until idle GPUs + those named reach the job's count, fit()
        # would refuse after every one of them (the same releases, in the same order, are
        # then made on the copy: the same capacities as releasing each as it came).
        lazy: dict[str, list] = {}  # node -> [idle GPUs at most, its events not yet released]
        for k in range(cursor, len(events)):
            event = events[k]
            end, _, alloc = event
            node = alloc.node
            cap = copies.get(node)
            if cap is not None:
                cap.release(alloc)
            elif whole > 0.0:
                got = lazy.get(node)
                if got is None:
                    got = lazy[node] = [caps[node].whole_free, []]
                got[0] += len(alloc.gpu_indices)
                got[1].append(alloc)
                if got[0] < whole:
                    continue
                cap = copies[node] = caps[node].copy()
                for a in got[1]:
                    cap.release(a)
            else:
                cap = copies[node] = caps[node].copy()
                cap.release(alloc)
            if cap.whole_free < whole:
                continue
            if cap.fit(job) is not None:
                self._shadow = (shape, self.seq, event, (node, end), shape in self.placer.failed)
                return node, end
        self._shadow = (shape, self.seq, None, None, False)
        return None

    def run(self, pending: list[_Pending], arrivals: ArrivalStream) -> dict[str, float]:
        """Start times of the pending jobs of interest (those that start within the step budget)."""
        starts: dict[str, float] = {}
        wanted = sum(1 for p in pending if p.interest)
        placer = self.placer
        t = self.now
        order = list(pending)
        changed = True  # did anything happen that could let a pending job start?
        next_t0 = math.inf
        for _step in range(self.max_steps):
            while arrivals.next_t0 <= t:
                bisect.insort(order, arrivals.pop(), key=lambda p: p.rank)
                changed = True
            if next_t0 <= t:
                changed = True
            if not changed:  # no shape became placeable: skip the scan, go to the next event
                t = self._advance(t, next_t0, arrivals)
                if t is None:
                    break
                changed = self._release_until(t)
                continue
            changed = False
            placer.now = t
            blocked: tuple[str, float] | None = None
            blocked_seen = False
            failed = placer.failed
            next_t0 = math.inf
            started = 0  # jobs started in this scan: dropped from the order after it
            # Shapes the shadow refused in this scan for jobs ending after it (b_at): every
            # place of such a shape was on the blocked node. Within a scan capacity only
            # shrinks (starts, no releases) and fit() is monotone in it, so until something
            # starts on the blocked node its places are exactly that node again: a later job
            # of the shape ending after b_at is refused the same way, and place() (which
            # would change nothing) is skipped. A start there may leave the shape no place
            # at all (place() then marks it failed), so it clears the set.
            refused: set[int] = set()
            for p in order:
                if p.t0 > t:
                    if p.t0 < next_t0:
                        next_t0 = p.t0
                    continue
                job = p.job
                if job.shape_id in failed:  # still does not fit: the first such job casts the shadow
                    if not blocked_seen:
                        blocked_seen = True
                        blocked = self.shadow(job)
                    continue
                end = t + p.walltime
                allowed = None
                if blocked is not None:
                    b_node, b_at = blocked
                    if end > b_at and job.shape_id in refused:
                        continue

                    def allowed(n: str, i: tuple[int, ...], s: float, b_node=b_node, b_at=b_at, end=end) -> bool:
                        return n != b_node or end <= b_at

                placed = placer.place(job, allowed)
                if placed is None:
                    if blocked is not None and end > b_at:
                        refused.add(job.shape_id)
                    if not blocked_seen:
                        blocked_seen = True
                        blocked = self.shadow(job)
                    continue
                node, indices, share = placed
                if refused and node == b_node:
                    refused.clear()
                self.push(end, _alloc_of(job, node, indices, share, t, end))
                p.started = True
                started += 1
                if p.interest:
                    starts[job.job_id] = t
                    if len(starts) == wanted:
                        return starts
            if started:
                order = [p for p in order if not p.started]
            t = self._advance(t, next_t0, arrivals)
            if t is None:
                break
            changed = self._release_until(t) or changed
        else:  # the step budget ran out at t: nothing still waiting starts before it
            self.ran_out = (t, order)
        return starts

    def after_budget(self) -> dict[str, float]:
        """Where :meth:`run` used up its step budget: the pooled sweep's start (as
        :meth:`.explain.Explainer.pooled_etas`: every GPU a slot, free when what holds it in
        this scenario ends) of each job of interest still waiting, from the simulated state
        then, in the scenario's order. Never before the time the budget ran out, so never
        before a start the scenario already made."""
        if self.ran_out is None:
            return {}
        t, order = self.ran_out
        free: dict[tuple[str, int], float] = {}
        for end, _, alloc in self.events[self.cursor :]:  # those still running at t (each ends after it)
            node = alloc.node
            for i in alloc.gpu_indices:
                if free.get((node, i), t) < end:
                    free[(node, i)] = end  # a shared GPU: free when its last share ends
        slots = [free.get((name, g.index), t) for name, cap in self.caps.items() for g in cap.node.gpus]
        heapq.heapify(slots)
        wanted = sum(1 for p in order if p.interest)
        starts: dict[str, float] = {}
        for p in order:
            if not wanted:
                break
            gpus = p.job.gpus
            if gpus > len(slots):
                continue
            n = int(round(gpus)) if gpus > 1 else 1
            for _ in range(n - 1):
                heapq.heappop(slots)
            start = slots[0] if slots[0] > p.t0 else p.t0
            end = start + (p.walltime * gpus if gpus <= 1 else p.walltime)
            heapq.heapreplace(slots, end)
            for _ in range(n - 1):
                heapq.heappush(slots, end)
            if p.interest:
                starts[p.job.job_id] = start
                wanted -= 1
        return starts

    def _advance(self, t: float, next_t0: float, arrivals: ArrivalStream) -> float | None:
        """The next event time (an end, an arrival, a hold lifting), or None when nothing is left."""
        t_next = min(next_t0, arrivals.next_t0)
        if self.cursor < len(self.events):
            t_next = min(t_next, self.events[self.cursor][0])
        return None if t_next == math.inf else max(t, t_next)

    def _release_until(self, t: float) -> bool:
        """End the allocations due by ``t``; True if some shape that did not fit may fit now."""
        events, failed = self.events, self.placer.failed
        before = len(failed)
        released = False
        while self.cursor < len(events) and events[self.cursor][0] <= t:
            self.placer.release(events[self.cursor][2], precise=True)
            self.cursor += 1
            released = True
        return released and len(failed) < before


class ArrivalStream:
    """Sampled future arrivals of one scenario, drawn as the forward simulation reaches them.

    A Poisson stream at ``rate`` until ``horizon`` (at most ``cap`` draws); each arrival is
    a copy of a random recent arrival, kept only if it outranks ``lowest`` (the lowest job
    of interest), and ranked between the head jobs it outranks and those it does not.
    ``next_t0`` is the time of the next kept arrival (``inf`` when there is none).
    """

    def __init__(
        self,
        rng: random.Random | None,
        inflow: Sequence[JobRequest],
        inflow_prio: Sequence[float],
        rate: float,
        neg_priorities: list[float],
        lowest: float,
        sigma: float,
        now: float,
        horizon: float,
        cap: int,
    ) -> None:
        self._rng = rng
        self._inflow = inflow
        self._prio = inflow_prio
        self._rate = rate
        self._neg_priorities = neg_priorities
        self._lowest = lowest
        self._sigma = sigma
        self._t = now
        self._horizon = horizon
        self._cap = cap
        self._n = 0
        self._next: _Pending | None = None
        self.next_t0 = math.inf
        self._draw()

    @classmethod
    def empty(cls) -> ArrivalStream:
        return cls(None, (), (), 0.0, [], 0.0, 0.0, 0.0, 0.0, 0)

    def pop(self) -> _Pending:
        """The next arrival (only when ``next_t0`` is finite)."""
        got = self._next
        assert got is not None
        self._draw()
        return got

    def _draw(self) -> None:
        self._next, self.next_t0 = None, math.inf
        rng = self._rng
        if rng is None:
            return
        inflow, prios = self._inflow, self._prio
        while self._n < self._cap:
            self._t += rng.expovariate(self._rate)
            if self._t > self._horizon:
                break
            self._n += 1
            pick = rng.randrange(len(inflow))
            prio = prios[pick]
            if prio <= self._lowest:
                continue
            sample = inflow[pick]
            k = bisect.bisect_left(self._neg_priorities, -prio)
            walltime = sample.walltime * math.exp(rng.gauss(0.0, self._sigma))
            t = self._t
            arrival = _renamed(sample, f"~inflow-{self._n}", t)
            self._next = _Pending((k - 0.5, t), arrival, t, False, min(walltime, arrival.limit))
            self.next_t0 = t
            return
        self._rng = None  # exhausted


def quantile(sorted_values: Sequence[float], q: float) -> float:
    k = (len(sorted_values) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def _range(sorted_starts: Sequence[float], now: float, widen: float) -> EtaRange:
    """Median start, and the P10-P90 widened by ``widen`` around now."""
    lo, hi = quantile(sorted_starts, 0.1), quantile(sorted_starts, 0.9)
    return quantile(sorted_starts, 0.5), now + (lo - now) / widen, now + (hi - now) * widen


class EtaModel:
    """ETAs and ranges for one pass's waiting jobs (see the module docstring)."""

    def __init__(
        self,
        state: ClusterState,
        now: float,
        caps: Mapping[str, NodeCapacity],
        holding: Sequence[Allocation],
        drain: Mapping[str, float] | None,
        targets: list[Target] | None,
        fairshare: Mapping[tuple[str, str], float],
    ) -> None:
        self.state = state
        self.config = state.config
        self.now = now
        self.caps = caps
        self.holding = sorted(holding, key=attrgetter("expected_end", "node", "job_id"))
        self.drain = drain
        self.targets = targets
        self.fairshare = fairshare
        self.total_gpus = sum(len(c.node.gpus) for c in caps.values() if c.node.schedulable)
        window = max(state.inflow_window_s, 1.0)
        inflow = sorted(state.inflow, key=lambda j: (j.submitted_at, j.job_id))
        self.inflow = inflow
        self.inflow_rate = len(inflow) / window  # jobs per second
        self._window = window
        self._inflow_arrival_prio: list[float] | None = None  # per inflow job (see _inflow_priorities)
        self._inflow_prio: list[float] = []
        self._inflow_work: list[float] = []
        self.spread = (0.5, 2.0)  # relative (low, high) below the head, refined from the head
        # Shape -> (ratio, offset) of the wait of the point, low and high below the head: the
        # forward result of the head's last job of that shape carried across the seam (carry_from)
        self.carry: dict[int, tuple[tuple[float, float], ...]] = {}

    def _inflow_priorities(self) -> list[float]:
        """Each recent arrival's priority on arrival, and the inflow work above each priority.

        Computed once per pass, and only in passes that ask for an ETA (the simulator asks
        only when a job arrives): scenarios sample from these, and the coarse stretch sums
        inflow work by arrival priority, highest first.
        """
        if self._inflow_arrival_prio is None:
            prios = arrival_priorities(self.inflow, self.fairshare, self.config)
            scored = sorted(((p, j.gpus * j.walltime) for p, j in zip(prios, self.inflow, strict=True)), reverse=True)
            self._inflow_prio = [-p for p, _ in scored]  # ascending, for bisect
            acc = 0.0
            for _, work in scored:
                acc += work / self._window
                self._inflow_work.append(acc)
            self._inflow_arrival_prio = prios
        return self._inflow_arrival_prio

    def inflow_rate_above(self, priority: float) -> float:
        """GPU-seconds per second of expected arrivals that would outrank a job of this priority."""
        neg_prios, work = self.inflow_table()
        k = bisect.bisect_left(neg_prios, -priority)
        return work[k - 1] if k > 0 else 0.0

    def inflow_table(self) -> tuple[list[float], list[float]]:
        """:meth:`inflow_rate_above` as two lists, for a loop over every waiting job: the
        arrivals' priorities negated (ascending) and the inflow work above each, cumulated."""
        self._inflow_priorities()
        return self._inflow_prio, self._inflow_work

    def head(
        self, jobs: Sequence[tuple[JobRequest, float, float, bool]], points: Mapping[str, float]
    ) -> dict[str, EtaRange]:
        """Forward-simulated ranges for ``jobs`` = (job, not-before, priority, interest), in order;
        ``points``: each one's pooled sweep start (for :meth:`coarse`, where scenarios ran out of steps)."""
        config = self.config
        if not jobs or config.eta_scenarios <= 0:
            return {}
        # A fixed seed: the same draws every pass, so ETAs move with the state, not with noise.
        rng = random.Random(20240601)
        sigma = self.state.runtime_sigma if self.state.runtime_sigma is not None else config.eta_runtime_sigma
        samples: dict[str, list[float]] = {}
        # Starts past a scenario's step budget: that time plus the pooled sweep's wait from the
        # state then (ForwardSim.after_budget)
        past_budget: dict[str, list[float]] = {}
        interest = [j.job_id for j, _, _, wanted in jobs if wanted]
        lowest = min(prio for _, _, prio, _ in jobs)
        now = self.now
        gauss, exp = rng.gauss, math.exp
        unknown = max(sigma, UNKNOWN_RUNTIME_SIGMA)
        # What every scenario redraws, prepared once: a running job's time left (None = due
        # now: it ends at ``now``, no draw), spread, latest end (its timeout: no draw passes
        # it), whether its node is schedulable.
        schedulable = {name for name, cap in self.caps.items() if cap.node.schedulable}
        held = [
            (
                a,
                a.expected_end - now if a.expected_end > now else None,
                sigma if a.estimated else unknown,
                a.ends_by,
                a.node in schedulable,
            )
            for a in self.holding
        ]
        spreads = [sigma if job.estimated else unknown for job, *_ in jobs]
        for _ in range(config.eta_scenarios):
            # Each running job's end drawn (the same draws, in the same order, as one
            # Allocation copy per job with the drawn end, but without the copies).
            events: list[tuple[float, int, Allocation]] = []
            seq = 0
            for a, left, spread, ends_by, keep in held:
                end = now + left * exp(gauss(0.0, spread)) if left is not None else now
                if end > ends_by:
                    end = ends_by
                if keep:
                    seq += 1
                    events.append((end if end > now else now, seq, a))
            # By (end, sequence): appended in sequence order, so a stable sort on the end alone
            # gives that order, on float keys (CPython compares those without the tuples).
            events.sort(key=_end_of)
            pending = [
                _Pending((k,), job, t0, wanted, min(job.walltime * exp(gauss(0.0, spread)), job.limit))
                for k, ((job, t0, _prio, wanted), spread) in enumerate(zip(jobs, spreads, strict=True))
            ]
            arrivals = self._arrivals(rng, jobs, lowest, sigma)
            sim = ForwardSim(self.caps, (), self.drain, now, config.eta_max_steps, events)
            for job_id, t in sim.run(pending, arrivals).items():
                samples.setdefault(job_id, []).append(t)
            for job_id, t in sim.after_budget().items():
                past_budget.setdefault(job_id, []).append(t)
        out: dict[str, EtaRange] = {}
        lows, highs = [], []
        widen = config.eta_range_widen
        now = self.now
        floors: dict[str, EtaRange] = {}
        for job_id in interest:
            got = sorted(samples.get(job_id, ()))
            if len(got) < config.eta_scenarios:
                # Not started within the step budget in every scenario: coarse, but no earlier
                # than where those scenarios stopped plus the pooled sweep's wait from there
                late = past_budget.get(job_id)
                if late is not None and len(got) + len(late) == config.eta_scenarios:
                    got = sorted(got + late)
                    floors[job_id] = _range(got, now, widen)
                continue
            out[job_id] = point, lo, hi = _range(got, now, widen)
            if point - now > 60.0:
                lows.append((lo - now) / (point - now))
                highs.append((hi - now) / (point - now))
        if lows:
            self.spread = (sorted(lows)[len(lows) // 2], sorted(highs)[len(highs) // 2])
        if floors:  # after the spread: the coarse range uses it
            for job, _, prio, _ in jobs:
                floor = floors.get(job.job_id)
                if floor is not None:
                    coarse = self.coarse(points[job.job_id], prio, stretch=config.eta_after_budget_stretch)
                    out[job.job_id] = tuple(c if c > f else f for c, f in zip(coarse, floor, strict=True))
        return out

    def _arrivals(self, rng: random.Random, jobs, lowest: float, sigma: float) -> ArrivalStream:
        """One sampled stream of future arrivals that outrank at least the lowest job of interest.

        Drawn lazily, from an RNG of its own seeded from ``rng``: a scenario usually ends
        (every job of interest started) after a few arrivals, and drawing all of them up
        front (up to ``4 × eta_head`` per scenario) was most of the planning pass's time.
        """
        if not self.inflow or self.inflow_rate <= 0:
            return ArrivalStream.empty()
        config = self.config
        return ArrivalStream(
            random.Random(rng.getrandbits(64)),
            self.inflow,
            self._inflow_priorities(),
            self.inflow_rate,
            [-prio for _, _, prio, _ in jobs],  # ascending (the head's order), for bisect
            lowest,
            sigma,
            self.now,
            self.now + config.eta_inflow_horizon_s,
            4 * config.eta_head,
        )

    def coarse(
        self, point: float, priority: float, shape: int | None = None, *, stretch: bool | None = None
    ) -> EtaRange:
        """A job below the head: the pooled sweep's start, stretched by inflow (unless not
        ``stretch``; None: as ``config.eta_below_head_stretch`` says, as below the head), with the
        head's spread, each wait carried on from the head's last job of its ``shape`` (:meth:`carry_from`)."""
        load_max = 0.9  # the stretch at most x10
        if stretch is None:  # below the head: its own switch and cap (Explainer.explain inlines this)
            stretch = self.config.eta_below_head_stretch
            load_max = self.config.eta_below_head_load_max
        now = self.now
        wait = max(0.0, point - now)
        if stretch and wait > 0 and self.total_gpus and self.inflow_rate > 0:  # no inflow: load 0, no stretch
            load = min(load_max, self.inflow_rate_above(priority) / self.total_gpus)
            wait /= 1.0 - load
        lo_f, hi_f = self.spread
        widen = self.config.eta_range_widen
        (r_mid, d_mid), (r_lo, d_lo), (r_hi, d_hi) = self.carry.get(shape, _NO_CARRY)  # type: ignore[arg-type]  # None: no shape, no carry
        return (
            now + (wait * r_mid + d_mid),
            now + (wait * lo_f / widen * r_lo + d_lo),
            now + (wait * hi_f * widen * r_hi + d_hi),
        )

    def carry_from(self, forward: EtaRange, point: float, priority: float, shape: int) -> None:
        """Carry the head's forward result across the seam: ``forward`` is the range
        :meth:`head` gave the head's last job of ``shape`` (waiting for resources, reserved or not), ``point``
        and ``priority`` its pooled sweep start and priority. Below the head, each of the
        coarse point's, low end's and high end's waits of a job of that shape is then scaled
        by that job's forward wait over its coarse one (never below 1: nothing is shown
        earlier than the coarse estimate alone).

        Per shape: a job of another shape may rightly start earlier (a one-GPU job backfills
        past a blocked eight-GPU one), and a blocked big job's ratio multiplied the small jobs'
        waits below it; a shape's jobs of one user start in queue order.

        Why: the coarse sweep knows nothing the scenarios learnt (each runtime's drawn error,
        whose mean is above the estimate, so a long line of jobs ends later than the sum of
        the estimates; the nodes' boundaries; the sampled arrivals), and with 4 GPUs and 160
        same-shape jobs position 128 (forward) was shown at 67,290 s, 129 (coarse) at 57,700 s.
        A ratio, not an offset: those causes grow with the wait (the runtimes' bias with the
        number of jobs ahead, the arrivals with the time waited), so the head's last job's
        ratio is the best guess of how far the sweep is off below it; an offset would fix the
        seam but let the error grow again further down. Where that job's coarse wait is 0 (no
        ratio), its forward wait is added instead. The ratio is capped at ``CARRY_RATIO_MAX``
        and what it leaves of that job's forward wait added: a shape the sweep starts at once
        and the scenarios much later (a whole node it needs, pooled GPUs it cannot use) is a
        one-off delay, not a rate, and an uncapped ratio of thousands multiplied every wait
        below. So that job itself is still shown at its forward (point, low, high), and with
        one same-shape line the job below the seam no earlier: its coarse waits are at least
        that job's, carried the same way."""
        self.carry.pop(shape, None)
        now = self.now
        carry = []
        for f, c in zip(forward, self.coarse(point, priority, shape), strict=True):
            f_wait, c_wait = f - now, c - now
            if f_wait <= c_wait:
                carry.append((1.0, 0.0))
            elif c_wait > 0.0:
                ratio = f_wait / c_wait
                carry.append((ratio, 0.0) if ratio <= CARRY_RATIO_MAX else (CARRY_RATIO_MAX, f_wait - c_wait * CARRY_RATIO_MAX))
            else:
                carry.append((1.0, f_wait))
        self.carry[shape] = tuple(carry)


def _renamed(job: JobRequest, job_id: str, at: float) -> JobRequest:
    """A sampled arrival: ``job`` under a new id, submitted at ``at``, never run.

    A shallow copy with five fields set, not ``dataclasses.replace``: a scenario samples
    hundreds of arrivals per pass, and ``replace`` (``__init__`` + ``__post_init__``) was
    most of the forward simulation's time. ``limit`` is the whole timeout again (no earlier
    attempt); ``walltime`` (at most the sample's own limit, no more than that) stays valid.
    """
    out = copy.copy(job)
    set_field = object.__setattr__
    set_field(out, "job_id", job_id)
    set_field(out, "submitted_at", at)
    set_field(out, "attained_s", 0.0)
    set_field(out, "limit", runtime_limit(job.timeout_s))
    set_field(out, "preemptions", 0)
    return out
