"""First come, first served, with head-of-line blocking: the baseline policy."""

from __future__ import annotations

import heapq

from .placement import EPS, best_fit, capacities
from .types import ClusterState, Plan, QueueEntry, Start


def plan_fifo(state: ClusterState, now: float) -> Plan:
    """Start jobs in submission order until the first one that does not fit.

    1. Order queued jobs by (submitted_at, job_id).
    2. Place each on the best-fitting node; stop at the first that does not fit
       (strict FIFO: nothing overtakes the head of the queue).
    3. Everything left waits; ETAs by list scheduling in FIFO order on the pooled GPUs
       (each GPU free at the latest expected end of what runs on it).
    """
    caps = capacities(state.nodes, state.running)
    order = sorted(state.queued, key=lambda j: (j.submitted_at, j.job_id))
    starts: list[Start] = []
    queue: list[QueueEntry] = []
    only = state.explain_only
    ends: dict[tuple[str, int], float] = {}
    for a in state.running:
        for i in a.gpu_indices:
            key = (a.node, i)
            ends[key] = max(ends.get(key, now), a.expected_end, now)
    blocked = False
    position = 0
    for job in order:
        if not blocked:
            placed = best_fit(caps, job)
            if placed is not None:
                node, indices, share = placed
                caps[node].take(indices, share, job.gpu_memory_mb, job.cpu_milli, job.memory_mb)
                starts.append(Start(job.job_id, node, indices, share, job.priority_class))
                for i in indices:
                    ends[(node, i)] = max(ends.get((node, i), now), now + job.walltime)
                continue
            blocked = True
            slots = [ends.get((n.name, g.index), now) for n in state.nodes if n.schedulable for g in n.gpus]
            heapq.heapify(slots)
        position += 1
        n = 1 if job.gpus < 1 else int(round(job.gpus))
        eta = None
        if n <= len(slots):
            popped = [heapq.heappop(slots) for _ in range(n)]
            eta = max(now, popped[-1])
            for _ in range(n):
                heapq.heappush(slots, eta + job.walltime * (job.gpus if job.gpus < 1 - EPS else 1.0))
        if only is None or job.job_id in only:
            reason = (
                f"waiting for {job.gpus:g} GPU(s) on one node"
                if position == 1
                else f"behind {position - 1} earlier job(s) (FIFO)"
            )
            queue.append(QueueEntry(job.job_id, position, 0.0, {}, eta, reason))
    return Plan(starts=tuple(starts), queue=tuple(queue))
