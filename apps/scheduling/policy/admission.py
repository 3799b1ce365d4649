"""Checks at submit time: reject a job that could never start, with a reason."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .placement import EPS, fits_empty_cluster
from .types import JobRequest, NodeInfo, PolicyConfig, TeamPolicy


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
