"""First come, first served, with head-of-line blocking: the baseline policy."""

from __future__ import annotations

from .placement import best_fit, capacities
from .types import ClusterState, Plan, QueueEntry, Start


def plan_fifo(state: ClusterState, now: float) -> Plan:
    """Start jobs in submission order until the first one that does not fit.

    1. Order queued jobs by (submitted_at, job_id).
    2. Place each on the best-fitting node; stop at the first that does not fit
       (strict FIFO: nothing overtakes the head of the queue).
    3. Everything left waits, with the earliest running job's end as a rough ETA.
    """
    caps = capacities(state.nodes, state.running)
    order = sorted(state.queued, key=lambda j: (j.submitted_at, j.job_id))
    starts: list[Start] = []
    queue: list[QueueEntry] = []
    blocked = False
    ends = sorted(a.expected_end for a in state.running)
    for job in order:
        if not blocked:
            placed = best_fit(caps, job)
            if placed is not None:
                node, indices, share = placed
                caps[node].take(indices, share, job.gpu_memory_mb, job.cpu_milli, job.memory_mb)
                starts.append(Start(job.job_id, node, indices, share, job.priority_class))
                continue
            blocked = True
            reason = f"waiting for {job.gpus:g} GPU(s) on one node"
        else:
            reason = "behind an earlier job (FIFO)"
        eta = ends[0] if ends else None
        queue.append(QueueEntry(job.job_id, len(queue) + 1, 0.0, {}, eta, reason))
    return Plan(starts=tuple(starts), queue=tuple(queue))
