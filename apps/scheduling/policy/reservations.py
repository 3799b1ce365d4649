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
    cap_at: NodeCapacity  # the node's capacity at ``at``, before the reserved job takes it
    indices: tuple[int, ...]
    share: float


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

    def forget_events(self) -> None:
        self._events = None

    # -- reserving and checking ----------------------------------------------------------

    def reserve(self, job: JobRequest) -> Reservation | None:
        """Earliest (time, node) at which ``job`` fits as running jobs end, earlier reservations held."""
        clones: dict[str, NodeCapacity] = {}

        def clone(node: str) -> NodeCapacity:
            c = clones.get(node)
            if c is None:
                c = clones[node] = self.caps[node].copy()
                for r in self.items:
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
                res = Reservation(job, node, at, c.copy(), fit[0], fit[1])
                self.items.append(res)
                return res
        return None

    def allowed_for(self, job: JobRequest, now: float) -> Callable[[str, tuple[int, ...], float], bool] | None:
        """A check for placing ``job`` now without delaying any reservation (None = nothing reserved)."""
        if not self.items:
            return None
        end = now + job.walltime

        def allowed(node: str, indices: tuple[int, ...], share: float) -> bool:
            touched = [r for r in self.items if r.node == node and end > r.at]
            for r in touched:
                trial = r.cap_at.copy()
                trial.take(indices, share, job.gpu_memory_mb, job.cpu_milli, job.memory_mb)
                if trial.fit(r.job) is None:
                    return False
            for r in touched:
                r.cap_at.take(indices, share, job.gpu_memory_mb, job.cpu_milli, job.memory_mb)
            return True

        return allowed
