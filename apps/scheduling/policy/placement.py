"""Where a job fits: free capacity per node and best-fit choice of GPUs.

A job's GPUs are always on one node. Whole-GPU jobs take idle GPUs on the node that is
left with the fewest idle GPUs (best fit keeps whole nodes free for big jobs).
Fractional jobs (``gpus < 1``) share a GPU: they go on the fullest already-shared GPU
that still has room (share and, when known, memory), and break an idle GPU only when
no shared one fits.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace

from .types import Allocation, JobRequest, NodeInfo

EPS = 1e-9
FRAGMENTATION_CANDIDATES = 16
Fit = tuple[str, tuple[int, ...], float]  # node, GPU indices, share of each GPU


@dataclass
class NodeCapacity:
    """Mutable free capacity of one node while a plan is being built."""

    node: NodeInfo
    gpu_free: dict[int, float]  # GPU index -> free fraction (1.0 = idle; < 0 = promised away)
    gpu_mem_free: dict[int, int]  # GPU index -> free memory in MB (0 if unknown)
    cpu_free: int
    mem_free: int
    whole_free: int = 0  # GPUs with gpu_free == 1
    node_gpu_memory: dict[int, int] = field(default_factory=dict)  # GPU index -> its memory (0 = unknown)

    @classmethod
    def of(cls, node: NodeInfo, running: Iterable[Allocation]) -> NodeCapacity:
        cap = cls(
            node=node,
            gpu_free={g.index: 1.0 for g in node.gpus},
            gpu_mem_free={g.index: _memory_free(g) for g in node.gpus},
            cpu_free=node.cpu_milli,
            mem_free=node.memory_mb,
            whole_free=len(node.gpus),
            node_gpu_memory={g.index: g.memory_mb for g in node.gpus},
        )
        for alloc in running:
            cap.take(alloc.gpu_indices, alloc.gpu_share, alloc.gpu_memory_mb, alloc.cpu_milli, alloc.memory_mb)
        return cap

    def copy(self) -> NodeCapacity:
        return NodeCapacity(
            self.node, dict(self.gpu_free), dict(self.gpu_mem_free), self.cpu_free, self.mem_free, self.whole_free,
            self.node_gpu_memory,
        )

    def take(self, indices, share: float, gpu_mem: int, cpu: int, mem: int, sign: int = 1) -> None:
        """Use (``sign=1``) or give back (``sign=-1``) resources on this node."""
        gpu_free = self.gpu_free
        delta = sign * share
        # A whole GPU taken from or given back to an idle or a fully used one: the result is a
        # whole number, which round() returns unchanged, so it is not called (most takes).
        whole = share == 1.0
        for i in indices:
            if i in gpu_free:
                before = gpu_free[i]
                if whole and (before == 1.0 or before == 0.0):
                    after = before - delta
                else:
                    after = round(before - delta, 6)
                gpu_free[i] = after
                self.whole_free += (after >= 1.0 - EPS) - (before >= 1.0 - EPS)
                if gpu_mem and self.node_gpu_memory.get(i):  # 0 = unknown memory: not tracked
                    self.gpu_mem_free[i] -= sign * gpu_mem
        if self.node.cpu_milli:
            self.cpu_free -= sign * cpu
        if self.node.memory_mb:
            self.mem_free -= sign * mem

    def release(self, alloc: Allocation) -> None:
        self.take(alloc.gpu_indices, alloc.gpu_share, alloc.gpu_memory_mb, alloc.cpu_milli, alloc.memory_mb, sign=-1)

    def fit(self, job: JobRequest) -> tuple[tuple[int, ...], float] | None:
        """GPU indices and per-GPU share for ``job`` on this node, or None."""
        node = self.node
        if not node.schedulable:
            return None
        if job.requires and not set(job.requires) <= set(node.features):
            return None
        if node.cpu_milli and job.cpu_milli > self.cpu_free:
            return None
        if node.memory_mb and job.memory_mb > self.mem_free:
            return None
        if job.image and node.images is not None and job.image not in node.images:
            return None
        if job.gpus < 1 and node.whole_gpus_only:
            return None
        need = job.gpus
        if need >= 1 and self.whole_free < need - EPS:
            return None
        models = job.gpu_models
        gmem = job.gpu_memory_mb
        gpu_free = self.gpu_free
        if need < 1:
            best = None
            for g in node.gpus:
                free = gpu_free[g.index]
                if free + EPS < need:
                    continue
                if models and g.model not in models:
                    continue
                if gmem and g.memory_mb and (g.memory_mb < gmem or self.gpu_mem_free[g.index] < gmem):
                    continue
                key = (free, g.index)  # fullest GPU that still has room
                if best is None or key < best:
                    best = key
            if best is None:
                return None
            return (best[1],), need
        whole = [
            g.index
            for g in node.gpus
            if gpu_free[g.index] >= 1.0 - EPS
            and (not models or g.model in models)
            and (not gmem or not g.memory_mb or (g.memory_mb >= gmem and self.gpu_mem_free[g.index] >= gmem))
        ]
        n = int(round(need))
        if len(whole) < n:
            return None
        whole.sort()
        return tuple(whole[:n]), 1.0

    def free_whole_gpus(self) -> int:
        return self.whole_free

    def has_partial(self) -> bool:
        for f in self.gpu_free.values():  # a loop, not any(<generator>): called on every take and release
            if EPS < f < 1.0 - EPS:
                return True
        return False


def capacities(nodes: Iterable[NodeInfo], running: Iterable[Allocation]) -> dict[str, NodeCapacity]:
    by_node: dict[str, list[Allocation]] = {}
    for alloc in running:
        by_node.setdefault(alloc.node, []).append(alloc)
    return {n.name: NodeCapacity.of(n, by_node.get(n.name, [])) for n in nodes}


def best_fit(caps: dict[str, NodeCapacity], job: JobRequest) -> Fit | None:
    """(node name, indices, share) on the node left with the fewest free GPUs."""
    best = None
    for name in sorted(caps):
        fit = caps[name].fit(job)
        if fit is None:
            continue
        key = _fit_key(caps[name], job, fit, name)
        if best is None or key < best[0]:
            best = (key, name, fit)
    if best is None:
        return None
    _, name, (indices, share) = best
    return name, indices, share


def _fit_key(cap: NodeCapacity, job: JobRequest, fit: tuple[tuple[int, ...], float], name: str):
    indices, share = fit
    if share < 1.0:
        free = cap.gpu_free[indices[0]]
        breaks_idle = free >= 1.0 - EPS
        return (breaks_idle, free, cap.whole_free, name)
    return (False, 0.0, cap.whole_free - len(indices), name)


Target = tuple[int, tuple[str, ...], int, float]  # a waiting shape's whole GPUs, models, GPU memory, weight


def gpu_serves(model: str, memory_mb: int, models: tuple[str, ...], gpu_memory_mb: int) -> bool:
    """Whether a GPU of this model and memory may serve a job asking for ``models`` and
    ``gpu_memory_mb`` (as :meth:`NodeCapacity.fit` judges: unknown memory, 0, qualifies)."""
    return (not models or model in models) and (not gpu_memory_mb or not memory_mb or memory_mb >= gpu_memory_mb)


def fragmentation(cap: NodeCapacity, targets: Iterable[Target]) -> float:
    """Free GPU capacity on the node that the waiting shapes cannot use, weighted by demand.

    In the spirit of FGD (Weng et al., ATC'23): for each target shape, the free capacity of
    the GPUs it may use (model and memory) is fragmented if the node cannot host the shape
    at all (too few idle GPUs), and partly-used GPUs are always fragmented for whole-GPU
    shapes.
    """
    per_kind: dict[tuple[str, int], list[float]] = {}  # (model, memory) -> [idle GPUs, free share of partly used]
    gpu_free = cap.gpu_free
    for g in cap.node.gpus:
        f = gpu_free[g.index]
        if f > EPS:
            kind = (g.model, g.memory_mb)
            counts = per_kind.get(kind)
            if counts is None:
                counts = per_kind[kind] = [0.0, 0.0]
            if f >= 1.0 - EPS:
                counts[0] += 1
            else:
                counts[1] += f
    if not per_kind:
        return 0.0
    total = 0.0
    for need, models, gmem, weight in targets:
        whole = partial = 0.0
        for (model, memory_mb), (w, p) in per_kind.items():
            if gpu_serves(model, memory_mb, models, gmem):
                whole += w
                partial += p
        total += weight * (partial + (whole if whole < need else 0.0))
    return total


def shape_of(job: JobRequest) -> tuple:
    """(GPUs, models, GPU memory, CPU, RAM, image, features): all that decides where a job fits.

    Derived once per job (``JobRequest.shape``); hot loops key by its number, ``job.shape_id``."""
    return job.shape


def _memory_free(gpu) -> int:
    """What a GPU has free for new jobs before our allocations are counted: its memory, or less
    when the driver measured less free (used outside the portal). 0 stays "unknown"."""
    if gpu.memory_free_mb is None or not gpu.memory_mb:
        return gpu.memory_mb
    return max(0, min(gpu.memory_mb, gpu.memory_free_mb))


class Placer:
    """Best-fit placement over a whole cluster, fast when the cluster is nearly full.

    Nodes are bucketed by how many idle GPUs they have, so a whole-GPU job looks only at
    nodes with enough idle GPUs. A job shape that did not fit stays unfittable for the
    rest of the pass (capacity only shrinks), so a queue of 10,000 similar jobs costs one
    scan, not 10,000. ``release`` (preemption) clears that memory.

    With ``drain`` (node -> time its last running job is expected to end) the first key is
    how much later the node would drain: a long job goes where long jobs already run, a
    short job anywhere it ends before the node drains anyway, so nodes empty out together
    and 8-GPU jobs find whole nodes. With ``targets`` (the whole-GPU shapes waiting jobs
    need), the next key is how much the placement adds to :func:`fragmentation`. Among
    equal nodes, best fit as in :func:`best_fit`.
    """

    def __init__(
        self,
        caps: dict[str, NodeCapacity],
        drain: dict[str, float] | None = None,
        now: float = 0.0,
        targets: list[Target] | None = None,
        pack_restarts: bool = False,
    ) -> None:
        self.caps = caps
        self.pack_restarts = pack_restarts
        self.drain = drain
        self.now = now
        self.targets = targets
        # Shapes are ``JobRequest.shape_id`` numbers in these sets and memos.
        self.failed: set[int] = set()
        self.failed_jobs: dict[int, JobRequest] = {}  # a job of each failed shape
        # Shape -> the shortest end refused by a reservation check (``place(..., memo=True)``):
        # capacity only shrinks and reservations only grow within a pass, so a job of that
        # shape that would end as late or later is refused too.
        self.refused: dict[int, float] = {}
        # Shape -> (version, {node: (best-fit key, fit)}): where the shape fits. ``_changed``
        # logs every node whose capacity changed (take, release); the version is its length,
        # and a later job of the shape re-checks only the nodes changed since (fit() and the
        # key depend on the shape and the node's capacity alone).
        self._changed: list[str] = []
        self._fits: dict[int, tuple[int, dict[str, tuple[tuple, tuple[tuple[int, ...], float]]]]] = {}
        self.buckets: dict[int, set[str]] = {}
        self.partial: set[str] = set()
        for name, cap in caps.items():
            if cap.node.schedulable:
                self._index(name, cap)

    def _index(self, name: str, cap: NodeCapacity) -> None:
        if cap.whole_free > 0:
            self.buckets.setdefault(cap.whole_free, set()).add(name)
        if cap.has_partial():
            self.partial.add(name)

    def _unindex(self, name: str, cap: NodeCapacity) -> None:
        bucket = self.buckets.get(cap.whole_free)
        if bucket is not None:
            bucket.discard(name)
            if not bucket:
                del self.buckets[cap.whole_free]
        self.partial.discard(name)

    def _delay(self, name: str, end: float) -> float:
        if self.drain is None:
            return 0.0
        later = end - self.drain.get(name, self.now)
        return later if later > 0 else 0.0

    def candidates(self, job: JobRequest) -> Iterator[Fit]:
        """Places for ``job`` right now, best first."""
        shape = job.shape_id
        if shape in self.failed:
            return
        caps = self.caps
        end = self.now + job.walltime
        changed = self._changed
        version = len(changed)
        cached = self._fits.get(shape)
        if cached is not None and version - cached[0] <= 64:
            base = cached[1]
            if cached[0] != version:
                # Only the nodes changed since. A node where the job fits is always among
                # the indexed ones below (idle GPUs enough, or a partly used GPU), so
                # fit() alone decides here.
                for name in set(changed[cached[0] :]):
                    cap = caps[name]
                    fit = cap.fit(job)
                    if fit is None:
                        base.pop(name, None)
                    else:
                        base[name] = (_fit_key(cap, job, fit, name), fit)
                self._fits[shape] = (version, base)
        else:
            if job.gpus < 1:
                names = set(self.partial)
                for bucket in self.buckets.values():
                    names.update(bucket)
            else:
                need = int(round(job.gpus))
                names = set()
                for k, bucket in self.buckets.items():
                    if k >= need:
                        names.update(bucket)
            base = {}
            for name in names:
                cap = caps[name]
                fit = cap.fit(job)
                if fit is not None:
                    base[name] = (_fit_key(cap, job, fit, name), fit)
            self._fits[shape] = (version, base)
        if not base:
            self.failed.add(shape)
            self.failed_jobs[shape] = job
            return
        drain = self.drain
        if drain is None:
            fits = [((0.0,) + key, name, fit) for name, (key, fit) in base.items()]
        elif self.pack_restarts and job.preemptions:
            # A restart: among nodes it delays equally, the one that drains last (PolicyConfig.
            # restart_packing). The key stays (delay, ...): the fragmentation groups below read it.
            now, drain_at = self.now, drain.get
            fits = []
            for name, (key, fit) in base.items():
                at = drain_at(name, now)
                later = end - at
                fits.append(((later if later > 0 else 0.0, -at) + key, name, fit))
        else:  # _delay inlined: how much later the node would drain (0 if not later)
            now, drain_at = self.now, drain.get
            fits = [
                ((later if (later := end - drain_at(name, now)) > 0 else 0.0,) + key, name, fit)
                for name, (key, fit) in base.items()
            ]
        targets = self.targets
        if not targets:
            # The best first, found without sorting: usually it is taken (every key ends
            # with the node's name, so it is the sorted list's first); the rest sorted only
            # when it was not.
            best = min(fits)
            _, name, fit = best
            yield name, fit[0], fit[1]
            if len(fits) > 1:
                fits.sort()
                for _, name, fit in fits[1:]:
                    yield name, fit[0], fit[1]
            return
        fits.sort()
        # Among nodes the job delays equally (first key), least added fragmentation first;
        # scored lazily, group by group, since usually the first place is taken, and only
        # the FRAGMENTATION_CANDIDATES best fits of a group (a big idle cluster has hundreds).
        k = 0
        while k < len(fits):
            delay = fits[k][0][0]
            group = []
            while k < len(fits) and fits[k][0][0] == delay:
                key, name, fit = fits[k]
                if len(group) >= FRAGMENTATION_CANDIDATES:
                    group.append(((math.inf,) + key[1:], name, fit))
                    k += 1
                    continue
                cap = caps[name]
                before = fragmentation(cap, targets)
                cap.take(fit[0], fit[1], 0, 0, 0)
                added = fragmentation(cap, targets) - before
                cap.take(fit[0], fit[1], 0, 0, 0, sign=-1)
                self._changed.append(name)  # taken back; do not trust the rounding to restore it exactly
                group.append(((round(added, 6),) + key[1:], name, fit))
                k += 1
            group.sort()
            for _, name, fit in group:
                yield name, fit[0], fit[1]

    def place(
        self,
        job: JobRequest,
        allowed: Callable[[str, tuple[int, ...], float], bool] | None = None,
        memo: bool = False,
    ) -> Fit | None:
        """The best place for ``job`` that ``allowed`` accepts; resources are taken.

        ``memo=True`` says ``allowed`` is the pass's reservation check: its refusals are
        remembered per shape (see ``refused``).
        """
        end = self.now + job.walltime
        shape = job.shape_id
        if memo and allowed is not None:
            refused_end = self.refused.get(shape)
            if refused_end is not None and end >= refused_end:
                return None
        for name, indices, share in self.candidates(job):
            if allowed is None or allowed(name, indices, share):
                self.take(name, job, indices, share)
                return name, indices, share
        if memo and allowed is not None and shape not in self.failed:
            if end < self.refused.get(shape, float("inf")):
                self.refused[shape] = end
        return None

    def take(self, name: str, job: JobRequest, indices: tuple[int, ...], share: float) -> None:
        self._changed.append(name)
        cap = self.caps[name]
        self._unindex(name, cap)
        cap.take(indices, share, job.gpu_memory_mb, job.cpu_milli, job.memory_mb)
        if cap.node.schedulable:
            self._index(name, cap)
        if self.drain is not None:
            end = self.now + job.walltime
            if end > self.drain.get(name, self.now):
                self.drain[name] = end

    def release(self, alloc: Allocation, precise: bool = False) -> None:
        """Give an allocation's resources back. ``precise``: forget only the failed shapes
        that now fit on its node (a few fit checks instead of new searches for every shape)."""
        self._retake(alloc, sign=-1)
        self.refused.clear()
        if not precise:
            self.failed.clear()
            return
        cap = self.caps.get(alloc.node)
        if cap is None:
            return
        whole_free = cap.whole_free + EPS  # a whole-GPU shape needing more cannot fit (fit's own check, first)
        jobs = self.failed_jobs
        for shape in [
            s for s in self.failed if ((j := jobs[s]).gpus < 1 or j.gpus <= whole_free) and cap.fit(j) is not None
        ]:
            self.failed.discard(shape)

    def restore(self, alloc: Allocation) -> None:
        """Undo :meth:`release` (a preemption that did not go ahead)."""
        self._retake(alloc, sign=1)

    def _retake(self, alloc: Allocation, sign: int) -> None:
        cap = self.caps.get(alloc.node)
        if cap is None:
            return
        self._changed.append(alloc.node)
        self._unindex(alloc.node, cap)
        cap.take(alloc.gpu_indices, alloc.gpu_share, alloc.gpu_memory_mb, alloc.cpu_milli, alloc.memory_mb, sign)
        if cap.node.schedulable:
            self._index(alloc.node, cap)


def fits_empty_cluster(nodes: Iterable[NodeInfo], job: JobRequest) -> bool:
    """Could ``job`` ever run here, with every node idle?"""
    caps = capacities([as_empty(n) for n in nodes], [])
    return any(c.fit(job) is not None for c in caps.values())


def as_empty(node: NodeInfo) -> NodeInfo:
    """The node schedulable and idle: no GPU memory measured in use (that frees up)."""
    gpus = tuple(replace(g, memory_free_mb=None) if g.memory_free_mb is not None else g for g in node.gpus)
    return replace(node, gpus=gpus, schedulable=True)
