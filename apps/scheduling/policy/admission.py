"""Jobs that can never start: the per-job limit rule (one place) and "no node can hold it".

``admission_error`` is the submit-time check; :class:`NeverStarts` is the same rule
inside a planning pass, memoised per job shape and team, against schedulable nodes only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .placement import EPS, NodeCapacity, as_empty, fits_empty_cluster
from .types import ClusterState, JobRequest, NodeInfo, PolicyConfig, TeamPolicy


def admission_error(
    nodes: Iterable[NodeInfo],
    job: JobRequest,
    config: PolicyConfig,
    teams: Mapping[str, TeamPolicy] | None = None,
) -> str | None:
    """Why ``job`` can never start on this cluster under this config, or None if it can."""
    limit = limit_error(job, config, teams)
    if limit is not None:
        return limit
    if not fits_empty_cluster(list(nodes), job):
        return "no node can fit this job's GPUs, GPU model/memory, CPU and RAM on one node"
    return None


def limit_error(job: JobRequest, config: PolicyConfig, teams: Mapping[str, TeamPolicy] | None = None) -> str | None:
    """The per-job and per-team GPU limits a job can never get past, or None."""
    tp = config.team(teams or {}, job.team)
    limit = tp.max_gpus_per_job if tp.max_gpus_per_job is not None else config.max_gpus_per_job
    if limit is not None and job.gpus > limit + EPS:
        return f"asks for {job.gpus:g} GPUs; the per-job limit is {limit:g}"
    if tp.max_gpus is not None and job.gpus > tp.max_gpus + EPS:
        return f"asks for {job.gpus:g} GPUs; team {job.team} may hold at most {tp.max_gpus:g}"
    return None


def gpus_text(job: JobRequest) -> str:
    """``2 GPUs on one node (A100)``, ``0.5 of a GPU``: what a job waits for, in words."""
    if job.gpus < 1:
        what = f"{job.gpus:g} of a GPU"
    else:
        what = f"{job.gpus:g} GPU{'s' if job.gpus != 1 else ''} on one node"
    if job.gpu_models:
        what += f" ({'/'.join(job.gpu_models)})"
    return what


_ANSWERS: dict[tuple, dict[tuple, str | None]] = {}  # cluster + limits -> (shape id, team) -> answer
_ANSWERS_KEPT = 8


class NeverStarts:
    """Why a job can never start here (limits, or no schedulable node), or None.

    When only unschedulable nodes (draining, lost, not reporting) could hold it, the reason
    names them instead: the job waits for one of them, not forever.

    The answer depends only on the job's shape and team, the schedulable nodes and the
    limits, so it is computed once per (shape, team) and kept across passes for as long as
    the nodes and limits stay the same (a small module-level memo; the pass stays a pure
    function of its inputs).
    """

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        cluster = (
            tuple(state.nodes),  # the unschedulable ones too: a reason names those that could hold a job
            state.config.max_gpus_per_job,
            state.config.default_team,
            tuple(sorted(state.teams.items())),
        )
        cache = _ANSWERS.get(cluster)
        if cache is None:
            if len(_ANSWERS) >= _ANSWERS_KEPT:
                _ANSWERS.pop(next(iter(_ANSWERS)))
            cache = _ANSWERS[cluster] = {}
        self._cache = cache
        self._empty_nodes: list[NodeCapacity] | None = None

    UNKNOWN = object()  # ``known.get(key, UNKNOWN)``: not computed yet

    @property
    def known(self) -> dict[tuple, str | None]:
        """The answers so far, by (``job.shape_id``, team): a hot loop looks here first."""
        return self._cache

    def reason(self, job: JobRequest) -> str | None:
        key = (job.shape_id, job.team)
        if key in self._cache:
            return self._cache[key]
        never = self._cache[key] = self._compute(job)
        return never

    def _compute(self, job: JobRequest) -> str | None:
        limit = limit_error(job, self.state.config, self.state.teams)
        if limit is not None:
            return limit
        if self._empty_nodes is None:
            empty = [as_empty(n) for n in self.state.nodes if n.schedulable]
            distinct = {(n.gpus, n.cpu_milli, n.memory_mb, n.images, n.features, n.whole_gpus_only): n for n in empty}
            self._empty_nodes = [NodeCapacity.of(n, ()) for n in distinct.values()]
        if not any(c.fit(job) is not None for c in self._empty_nodes):
            resting = [n for n in self.state.nodes
                       if not n.schedulable and NodeCapacity.of(as_empty(n), ()).fit(job) is not None]
            if resting:
                # Not "never": Resume (or the worker's return) makes it placeable at once.
                return (f"the nodes that could hold {gpus_text(job)} take no new work: "
                        + ", ".join(f"{n.name} ({n.unschedulable_because or 'not schedulable'})" for n in resting))
            if job.image and not any(c.node.images is None or job.image in c.node.images for c in self._empty_nodes):
                return f"no schedulable node has image {job.image}"
            return f"no schedulable node can ever fit {gpus_text(job)} with the CPU/RAM asked"
        return None
