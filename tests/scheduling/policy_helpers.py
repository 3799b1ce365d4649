"""Small builders for policy tests (pure: no Django)."""

from __future__ import annotations

from apps.scheduling.policy import Allocation, ClusterState, GpuInfo, JobRequest, NodeInfo, PolicyConfig

NOW = 1_800_000_000.0
HOUR = 3600.0


def node(
    name: str, gpus: int = 8, model: str = "A100", gpu_mb: int = 81920, cpu: int = 128000, mem: int = 1_048_576
) -> NodeInfo:
    return NodeInfo(name, tuple(GpuInfo(i, model, gpu_mb) for i in range(gpus)), cpu, mem)


def job(
    job_id: str,
    *,
    team: str = "vision",
    user: str = "ann",
    gpus: float = 1.0,
    cls: str = "medium",
    age_s: float = 0.0,
    walltime_s: float = HOUR,
    **kw,
) -> JobRequest:
    return JobRequest(
        job_id,
        team,
        user,
        NOW - age_s,
        gpus=gpus,
        priority_class=cls,
        timeout_s=kw.pop("timeout_s", 24 * HOUR),
        walltime_s=walltime_s,
        **kw,
    )


def running(
    job_id: str,
    node_name: str,
    indices: tuple[int, ...],
    *,
    team: str = "vision",
    user: str = "bob",
    share: float = 1.0,
    cls: str = "medium",
    ran_s: float = HOUR,
    left_s: float = HOUR,
    preemptible: bool = False,
    **kw,
) -> Allocation:
    return Allocation(
        job_id,
        team,
        user,
        node_name,
        indices,
        gpu_share=share,
        priority_class=cls,
        started_at=NOW - ran_s,
        expected_end=NOW + left_s,
        preemptible=preemptible,
        **kw,
    )


def fair(**kw) -> PolicyConfig:
    kw.setdefault("user_gpu_hours_per_day", None)
    return PolicyConfig(policy="fair", **kw)


def state(nodes, queued=(), running_=(), config: PolicyConfig | None = None, **kw) -> ClusterState:
    return ClusterState(tuple(nodes), tuple(running_), tuple(queued), config or fair(), **kw)
