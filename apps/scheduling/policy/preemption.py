"""Which running jobs to requeue so that a job that does not fit can start."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .placement import NodeCapacity
from .priority import CLASS_RANK
from .types import Allocation, JobRequest

VICTIM_CLASSES = ("low", "medium")


def choose_victims(
    job: JobRequest,
    running: Iterable[Allocation],
    caps: Mapping[str, NodeCapacity],
    preempted: set[str],
    now: float,
    min_runtime_s: float,
) -> tuple[str, list[Allocation]] | None:
    """The node and the fewest, lowest, most recent victims that make room for ``job``.

    1. Candidates: preemptible ``low``/``medium`` allocations that have run at least
       ``min_runtime_s`` and are not already preempted.
    2. Per node: release candidates lowest class first, most recently started first,
       until the job fits; then drop victims it turns out not to need.
    3. The node needing the fewest victims wins (then lowest classes, then most recent).
    """
    by_node: dict[str, list[Allocation]] = {}
    for a in running:
        if (
            a.preemptible
            and a.priority_class in VICTIM_CLASSES
            and a.job_id not in preempted
            and now - a.started_at >= min_runtime_s
        ):
            by_node.setdefault(a.node, []).append(a)
    best = None
    for node in sorted(by_node):
        cap = caps.get(node)
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
            trial.take(victim.gpu_indices, victim.gpu_share, victim.gpu_memory_mb, victim.cpu_milli, victim.memory_mb)
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
        return None
    return best[1], best[2]
