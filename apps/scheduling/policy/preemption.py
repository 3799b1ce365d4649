"""Which running jobs to requeue so that a job that does not fit can start.

Three reasons to preempt, tried in this order for a job that cannot start now:

1. **Over quota.** A running job whose user is past the daily GPU-hour quota runs only as
   preemptible "over quota" work: any waiting job of a user within quota may take its
   GPUs, whatever the classes.
2. **Urgent.** An urgent job (within its team's allowance) may preempt ``low``/``medium``
   jobs, whatever their size.
3. **Size (SRPT family).** A job may preempt jobs of the same or a lower class, no wider
   than itself, whose estimated remaining time, less the restart cost, exceeds
   ``preempt_work_ratio`` × its own runtime: every GPU then serves the job with the
   shortest remaining time, which lowers the mean completion time (shortest remaining
   processing time; QSSF orders the same way). "No wider" keeps a stream of short
   one-GPU jobs from breaking up whole-node jobs that would then have to drain a node
   again; a wide job may preempt narrow ones. Where either job has no runtime estimate,
   service attained so far decides instead (Tiresias' discretised queues): the victim
   must sit at least two ``attained_bins_gpu_hours`` bins above the waiting job. The
   timeout never stands in for an estimate.

Every victim has a checkpoint and a spec that allows preemption (``Allocation.preemptible``),
has run ``preempt_min_runtime_s`` in this attempt (over-quota victims excepted: they knew),
and has been preempted fewer than ``max_preemptions_per_job`` times — unless the job that
needs its GPUs is starving (``priority.starving_jobs``) and the victim has run
``starving_preempt_window_s`` in this attempt: without that, long jobs restarted after their
one preemption onto the nodes a whole-node job needs were immune there for weeks. A victim
is asked to stop at its next epoch end (``Preemption.grace_s``).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from .placement import EPS, NodeCapacity
from .priority import CLASS_RANK
from .types import Allocation, JobRequest, PolicyConfig

URGENT_VICTIM_CLASSES = ("low", "medium")
T = TypeVar("T")


@dataclass(frozen=True)
class Candidate:
    """A running allocation that some waiting job might preempt."""

    alloc: Allocation
    remaining_s: float  # estimated seconds left, less the restart cost
    remaining_gpu_s: float  # the same in GPU-seconds
    attained_bin: int
    estimated: bool
    over_quota: bool
    aged: bool  # has run preempt_min_runtime_s in this attempt
    # Preempted max_preemptions_per_job times already: only a starving job may preempt it,
    # and only once it has run starving_preempt_window_s in this attempt.
    immune: bool = False


def attained_bin(gpu_seconds: float, bins_gpu_hours: tuple[float, ...]) -> int:
    return bisect.bisect_right(bins_gpu_hours, gpu_seconds / 3600.0)


def fewest_victims(
    cap: NodeCapacity | None, job: JobRequest, ordered: Sequence[T], alloc_of: Callable[[T], Allocation]
) -> list[T] | None:
    """The victims on one node that make room for ``job``: release them in ``ordered`` order
    until it fits, then take back each it turns out not to need (greedy can over-pick).
    None when the node is gone or not schedulable, or all of them are not enough."""
    if cap is None or not cap.node.schedulable:
        return None
    trial = cap.copy()
    chosen: list[T] = []
    for victim in ordered:
        trial.release(alloc_of(victim))
        chosen.append(victim)
        if trial.fit(job) is not None:
            break
    else:
        return None
    for victim in list(chosen[:-1]):
        a = alloc_of(victim)
        trial.take(a.gpu_indices, a.gpu_share, a.gpu_memory_mb, a.cpu_milli, a.memory_mb)
        if trial.fit(job) is None:
            trial.release(a)
        else:
            chosen.remove(victim)
    return chosen


class VictimFinder:
    """Victim choice for one pass: candidates are computed once, refusals remembered.

    A refusal for a job shape holds for every later job of that shape, class and attained-
    service bin that is at least as large (fewer allocations qualify as its victims), until a
    preemption changes what runs: so a long queue of similar blocked jobs costs one search.
    """

    def __init__(
        self,
        running: Iterable[Allocation],
        config: PolicyConfig,
        now: float,
        over_quota_jobs: set[str],
        starving: set[str] | frozenset[str] = frozenset(),
    ) -> None:
        self.config = config
        self.now = now
        self.starving = starving
        restart = config.restart_cost_s
        bins = config.attained_bins_gpu_hours
        window = config.starving_preempt_window_s
        self.candidates: list[Candidate] = []
        for a in running:
            if not a.preemptible:
                continue
            immune = a.preemptions >= config.max_preemptions_per_job
            if immune and (window is None or not starving):
                continue
            remaining = max(0.0, a.expected_end - now) - restart
            self.candidates.append(
                Candidate(
                    a,
                    remaining,
                    a.gpus * remaining,
                    attained_bin(a.attained_gpu_s(now), bins),
                    a.estimated,
                    a.job_id in over_quota_jobs,
                    now - a.started_at >= config.preempt_min_runtime_s,
                    immune,
                )
            )
        # Largest remaining work first: the victims that shorten the mean completion time most;
        # jobs never preempted as often as the cap before capped ("immune") ones, so a starving
        # job requeues a job a second time only where a first-time victim will not do.
        self.candidates.sort(
            key=lambda c: (not c.over_quota, c.immune, -c.remaining_gpu_s, -c.alloc.started_at, c.alloc.job_id)
        )
        self._refused: dict[tuple, float] = {}

    def eligible(
        self, c: Candidate, job: JobRequest, cls: str, over_quota_job: bool, ignore_age: bool = False
    ) -> bool:
        a = c.alloc
        if c.immune and (
            job.job_id not in self.starving
            or (not ignore_age and self.now - a.started_at < (self.config.starving_preempt_window_s or 0.0))
        ):
            return False
        if c.over_quota and not over_quota_job:
            return True
        if not c.aged and not ignore_age:
            return False
        if cls == "urgent" and a.priority_class in URGENT_VICTIM_CLASSES:
            return True
        if not self.config.size_preemption or CLASS_RANK.get(a.priority_class, 1) > CLASS_RANK[cls]:
            return False
        if a.gpus > job.gpus + EPS:
            return False
        if c.estimated and job.estimated:
            return c.remaining_s >= self.config.preempt_work_ratio * job.walltime
        own_bin = attained_bin(job.gpus * job.attained_s, self.config.attained_bins_gpu_hours)
        return c.attained_bin >= own_bin + 2

    def releasable(self, job: JobRequest, cls: str, preempted: set[str]) -> dict[str, float]:
        """Running jobs ``job`` may preempt, each with the time from which it may (for its
        reservation), as :meth:`eligible` decides without ``ignore_age``: once it has run
        ``preempt_min_runtime_s`` (over-quota work at once), and an immune one (preempted
        ``max_preemptions_per_job`` times) once it has run ``starving_preempt_window_s``."""
        out = {}
        config = self.config
        for c in self.candidates:
            if c.alloc.job_id not in preempted and self.eligible(c, job, cls, False, ignore_age=True):
                ran = 0.0 if c.over_quota else config.preempt_min_runtime_s
                if c.immune:
                    ran = max(ran, config.starving_preempt_window_s or 0.0)
                out[c.alloc.job_id] = max(self.now, c.alloc.started_at + ran)
        return out

    def _refusal_key(self, job: JobRequest, cls: str) -> tuple:
        """All :meth:`eligible` reads of ``job`` but its work (``gpus × walltime``, compared):
        the shape, class, whether it has an estimate, whether it starves, and its attained-
        service bin (a victim without an estimate, or any victim of a job without one, is
        compared by bins: two jobs of one shape and work may see different victims)."""
        own_bin = attained_bin(job.gpus * job.attained_s, self.config.attained_bins_gpu_hours)
        return (job.shape_id, cls, job.estimated, job.job_id in self.starving, own_bin)

    def refuses(self, job: JobRequest, cls: str) -> bool:
        """Whether :meth:`find` would refuse ``job`` at once (an earlier refusal holds for it)."""
        refused = self._refused.get(self._refusal_key(job, cls))
        return refused is not None and job.gpus * job.walltime >= refused

    def find(
        self,
        job: JobRequest,
        cls: str,
        caps: Mapping[str, NodeCapacity],
        preempted: set[str],
        over_quota_job: bool = False,
    ) -> tuple[str, list[Allocation]] | None:
        """The node and the victims that make room for ``job`` there, or None.

        1. Eligible candidates (:meth:`eligible`), grouped by node, over-quota work first,
           then jobs not yet preempted as often as the cap, then largest remaining work first.
        2. Per node: release them in that order until the job fits; then drop victims it
           turns out not to need (greedy can over-pick).
        3. The node needing the fewest victims within quota wins, then the fewest capped
           ("immune") victims, then the fewest victims, then the lowest victim class, then
           the most remaining work freed, then the name.
        """
        key = self._refusal_key(job, cls)
        need = job.gpus * job.walltime
        refused = self._refused.get(key)
        if refused is not None and need >= refused:
            return None
        by_node: dict[str, list[Candidate]] = {}
        for c in self.candidates:
            if c.alloc.job_id in preempted or not self.eligible(c, job, cls, over_quota_job):
                continue
            by_node.setdefault(c.alloc.node, []).append(c)
        best = None
        for node in sorted(by_node):
            chosen = fewest_victims(caps.get(node), job, by_node[node], lambda c: c.alloc)
            if chosen is None:
                continue
            rank = (
                sum(not c.over_quota for c in chosen),
                sum(c.immune for c in chosen),
                len(chosen),
                max(CLASS_RANK.get(c.alloc.priority_class, 1) for c in chosen),
                -sum(c.remaining_gpu_s for c in chosen),
                node,
            )
            if best is None or rank < best[0]:
                best = (rank, node, [c.alloc for c in chosen])
        if best is None:
            if refused is None or need < refused:
                self._refused[key] = need
            return None
        return best[1], best[2]

    def forget_refusals(self) -> None:
        """A preemption changed what runs: earlier refusals may no longer hold."""
        self._refused.clear()


def choose_victims_legacy(
    job: JobRequest,
    running: Iterable[Allocation],
    caps: Mapping[str, NodeCapacity],
    preempted: set[str],
    now: float,
    min_runtime_s: float,
) -> tuple[str, list[Allocation]] | None:
    """Urgent-only preemption as it was before size-aware preemption (``size_preemption=False``).

    Kept so that switching the new mechanisms off reproduces the earlier policy exactly
    (the baseline of the ablation): victims are checkpointed ``low``/``medium`` jobs old
    enough, taken lowest class first, most recent first; the node needing the fewest
    victims (then lowest classes, then most recent) wins.
    """
    by_node: dict[str, list[Allocation]] = {}
    for a in running:
        if (
            a.preemptible
            and a.priority_class in URGENT_VICTIM_CLASSES
            and a.job_id not in preempted
            and now - a.started_at >= min_runtime_s
        ):
            by_node.setdefault(a.node, []).append(a)
    best = None
    for node in sorted(by_node):
        ordered = sorted(by_node[node], key=lambda a: (CLASS_RANK[a.priority_class], -a.started_at, a.job_id))
        chosen = fewest_victims(caps.get(node), job, ordered, lambda a: a)
        if chosen is None:
            continue
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
