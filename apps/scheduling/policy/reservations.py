"""Backfill reservations: the top blocked jobs get a node and a start time; later jobs may
start now only where they delay none of them.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .placement import NodeCapacity
from .types import Allocation, JobRequest


@dataclass
class Reservation:
    job: JobRequest
    node: str
    at: float
    # The node's capacity at ``at`` from allocations alone (running jobs still running then,
    # and jobs this pass started that will still run), without any reservation taken.
    base_at: NodeCapacity
    indices: tuple[int, ...]  # where the reserved job fits at ``at``; may move when backfill is checked
    share: float
    # Running jobs ``base_at`` already counts as gone (the reserved job may preempt them by
    # ``at``): another job preempting one frees nothing more for this reservation.
    drained: frozenset[str] = frozenset()

    def take_from(self, cap: NodeCapacity) -> None:
        j = self.job
        cap.take(self.indices, self.share, j.gpu_memory_mb, j.cpu_milli, j.memory_mb)


class Reservations:
    """The reservations of one pass and the release events they are computed from.

    ``running`` and ``started`` are the pass's allocations (kept up to date by the
    planner; a preemption must call :meth:`forget_events`), ``preempted`` the job ids
    it has requeued.
    """

    def __init__(
        self,
        caps: Mapping[str, NodeCapacity],
        now: float,
        running: tuple[Allocation, ...],
        started: list[Allocation],
        preempted: set[str],
    ) -> None:
        self.caps = caps
        self.now = now
        self.running = running
        self.started = started
        self.preempted = preempted
        self.items: list[Reservation] = []
        self.by_node: dict[str, list[Reservation]] = {}
        self._order: dict[str, int] = {}  # job id -> order the reservation was made in
        self._cancelled: list[Reservation] = []
        self._events: list[tuple[float, str, str, Allocation]] | None = None

    def __len__(self) -> int:
        return len(self.items)

    # -- release events ----------------------------------------------------------------

    def release_events(self) -> list[tuple[float, str, str, Allocation]]:
        if self._events is None:
            now = self.now
            allocs = [a for a in self.running if a.job_id not in self.preempted] + self.started
            self._events = sorted((max(a.expected_end, now), a.node, a.job_id, a) for a in allocs)
        return self._events

    def on_start(self, alloc: Allocation) -> None:
        if self._events is not None:
            bisect.insort(self._events, (alloc.expected_end, alloc.node, alloc.job_id, alloc))

    def on_preempt(self, victim: Allocation, sign: int = -1) -> None:
        """A victim's resources are free (``sign=-1``; ``1`` undoes it) at every reservation
        on its node that it would otherwise still have held (not at one that already counted
        it as drained: releasing it twice let a job preempt it and take the GPUs reserved)."""
        for r in self.by_node.get(victim.node, ()):
            if victim.expected_end > r.at and victim.job_id not in r.drained:
                r.base_at.take(
                    victim.gpu_indices,
                    victim.gpu_share,
                    victim.gpu_memory_mb,
                    victim.cpu_milli,
                    victim.memory_mb,
                    sign,
                )

    def cancel(self, job_id: str) -> None:
        """The reserved job starts after all (it preempted): its reservation goes (undo: restore_cancelled)."""
        self._cancelled = [r for r in self.items if r.job.job_id == job_id]
        if not self._cancelled:
            return
        self.items = [r for r in self.items if r.job.job_id != job_id]
        for r in self._cancelled:
            self.by_node[r.node] = [x for x in self.by_node[r.node] if x is not r]

    def restore_cancelled(self) -> None:
        for r in self._cancelled:
            self.items.append(r)
            self.by_node.setdefault(r.node, []).append(r)
        self.items.sort(key=lambda r: self._order[r.job.job_id])
        for node in {r.node for r in self._cancelled}:
            self.by_node[node].sort(key=lambda r: self._order[r.job.job_id])
        self._cancelled = []

    def forget_events(self) -> None:
        self._events = None

    # -- reserving and checking ----------------------------------------------------------

    def reserve(self, job: JobRequest, preemptible: Mapping[str, float] | None = None) -> Reservation | None:
        """Earliest (time, node) at which ``job`` fits as running jobs end, earlier reservations held.

        Per node two running copies of its capacity are released event by event: one from
        allocations alone (stored with the reservation), one with the node's earlier
        reservations taken (where the job must fit). Allocations in ``preemptible`` (jobs
        this one may preempt, each with the time from which it may: now, or once the job has
        run ``preempt_min_runtime_s``) count as released then, if they do not end earlier:
        the node need only drain of the others, and at its reservation the job preempts
        them. Without that, a whole-node job waits for the last long job on some node to end,
        weeks away; timing all of them *now* made the reservation (and the ETA) too early.
        """
        events = self.release_events()
        if preemptible:
            events = sorted(
                ((min(at, preemptible[job_id]) if job_id in preemptible else at), node, job_id, alloc)
                for at, node, job_id, alloc in events
            )
        clones: dict[str, tuple[NodeCapacity, NodeCapacity]] = {}
        drained: dict[str, set[str]] = {}  # node -> preemptible jobs released so far
        for at, node, job_id, alloc in events:
            if node not in self.caps:
                continue
            pair = clones.get(node)
            if pair is None:
                base = self.caps[node].copy()
                held = base.copy()
                for r in self.by_node.get(node, ()):
                    r.take_from(held)
                pair = clones[node] = (base, held)
            base, held = pair
            base.release(alloc)
            held.release(alloc)
            if preemptible and job_id in preemptible:
                drained.setdefault(node, set()).add(job_id)
            fit = held.fit(job)
            if fit is not None:
                gone = frozenset(drained.get(node, ()))
                res = Reservation(job, node, at, base.copy(), fit[0], fit[1], gone)
                self._order[job.job_id] = len(self._order)
                self.items.append(res)
                self.by_node.setdefault(node, []).append(res)
                return res
        return None

    def allowed_for(self, job: JobRequest, now: float) -> Callable[[str, tuple[int, ...], float], bool] | None:
        """A check for placing ``job`` now without delaying any reservation (None = nothing reserved).

        All reservations on the node are checked together, in the order they were made:
        each must still fit at its own time beside what runs then (this job included if it
        still runs) and beside the node's earlier reservations pinned where they now fit.
        Checking each alone is not enough: two reservations for the same time could each
        count on the same free GPU. A reservation is not pinned to the GPUs it was given
        (a backfill job may use GPUs the reserved job does not need; it moves).
        """
        if not self.items:
            return None
        end = now + job.walltime
        gmem, cpu, mem = job.gpu_memory_mb, job.cpu_milli, job.memory_mb

        def allowed(node: str, indices: tuple[int, ...], share: float) -> bool:
            on_node = self.by_node.get(node)
            if not on_node:
                return True
            if not any(end > r.at for r in on_node):
                return True
            fits: list[tuple[tuple[int, ...], float]] = []
            for k, r in enumerate(on_node):
                trial = r.base_at.copy()
                if end > r.at:
                    trial.take(indices, share, gmem, cpu, mem)
                for earlier, (e_indices, e_share) in zip(on_node[:k], fits, strict=True):
                    ej = earlier.job
                    trial.take(e_indices, e_share, ej.gpu_memory_mb, ej.cpu_milli, ej.memory_mb)
                fit = trial.fit(r.job)
                if fit is None:
                    return False
                fits.append(fit)
            for r, (r_indices, r_share) in zip(on_node, fits, strict=True):
                if end > r.at:
                    r.base_at.take(indices, share, gmem, cpu, mem)
                r.indices, r.share = r_indices, r_share
            return True

        return allowed
