"""Checks at submit time: reject a job that could never start, with a reason."""

from __future__ import annotations

from typing import Iterable, Mapping

from .placement import EPS, fits_empty_cluster
from .types import DAY_S, JobRequest, NodeInfo, PolicyConfig, TeamPolicy


def admission_error(
    nodes: Iterable[NodeInfo],
    job: JobRequest,
    config: PolicyConfig,
    teams: Mapping[str, TeamPolicy] | None = None,
) -> str | None:
    """Why ``job`` can never start on this cluster under this config, or None if it can."""
    tp = config.team(teams or {}, job.team)
    limit = tp.max_gpus_per_job if tp.max_gpus_per_job is not None else config.max_gpus_per_job
    if limit is not None and job.gpus > limit + EPS:
        return f"asks for {job.gpus:g} GPUs; the per-job limit is {limit:g}"
    if tp.max_gpus is not None and job.gpus > tp.max_gpus + EPS:
        return f"asks for {job.gpus:g} GPUs; team {job.team} may hold at most {tp.max_gpus:g}"
    if not fits_empty_cluster(list(nodes), job):
        return "no node can fit this job's GPUs, GPU model/memory, CPU and RAM on one node"
    hours = tp.user_gpu_hours_per_day if tp.user_gpu_hours_per_day is not None else config.user_gpu_hours_per_day
    needed = job.gpus * min(job.walltime, DAY_S)
    if hours is not None and needed > hours * 3600 + EPS:
        return (f"needs {needed / 3600:.1f} GPU-hours within 24 h, more than the daily quota of "
                f"{hours:g}; lower its timeout or GPUs")
    return None
