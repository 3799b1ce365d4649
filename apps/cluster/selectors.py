from __future__ import annotations

from django.utils import timezone

from apps.accounts.selectors import team_ids
from apps.jobs.models import HOLDING_STATES, Job

from .models import ForeignAllocation, Node


def cluster_overview(*, user) -> list[dict]:
    """Every node and GPU with what runs on it. Jobs of other teams show only as 'busy'."""
    visible = set(team_ids(user=user))
    now = timezone.now()
    holding = Job.objects.filter(state__in=HOLDING_STATES, node__isnull=False).select_related("team", "user")
    by_gpu: dict[tuple[int, int], list[Job]] = {}
    for job in holding:
        for index in job.gpu_indices or []:
            by_gpu.setdefault((job.node_id, index), []).append(job)
    outside: dict[tuple[int, int], list[str]] = {}
    for row in ForeignAllocation.objects.all():
        for index in row.gpu_indices or []:
            outside.setdefault((row.node_id, index), []).append(row.description or row.external_id)
    nodes = []
    for node in Node.objects.prefetch_related("gpus"):
        gpus = []
        for gpu in node.gpus.all():
            jobs = by_gpu.get((node.pk, gpu.index), [])
            gpus.append({
                "index": gpu.index,
                "model": gpu.model,
                "memory_mb": gpu.memory_mb,
                "memory_used_mb": gpu.memory_used_mb,
                "utilization": gpu.utilization,
                "simulated": gpu.simulated,
                "allocated": round(sum(j.gpu_share for j in jobs) + len(outside.get((node.pk, gpu.index), [])), 3),
                # Held by work started outside the portal (a Slurm job submitted directly).
                "outside": outside.get((node.pk, gpu.index), []),
                "jobs": [
                    {"id": str(j.pk), "task_name": j.task_name, "team": j.team.slug, "user": j.user.username,
                     "state": j.state, "share": j.gpu_share}
                    if j.team_id in visible else {"id": None, "team": None, "share": j.gpu_share, "state": "busy"}
                    for j in jobs
                ],
            })
        nodes.append({
            "name": node.name,
            "state": node.state,
            "drain_reason": node.drain_reason,  # why an operator drained it ("" when not said)
            "storage_problem": node.storage_problem,  # its worker cannot read the shared storage ("" = fine)
            "alive": node.is_alive(now),
            "simulated": node.simulated,
            "cpu_count": node.cpu_count,
            "memory_mb": node.memory_mb,
            "executor": node.executor,
            "partition": node.partition,
            "images": node.images,
            "limits_enforced": node.limits_enforced,
            "limits": node.limits_summary,
            "last_heartbeat": node.last_heartbeat,
            "gpus": gpus,
        })
    return nodes


def takes_work(node: dict) -> bool:
    """An active node that reports and reaches the shared storage: its idle GPUs are capacity (a lost
    or draining node's are not)."""
    return node["alive"] and node["state"] == Node.State.ACTIVE and not node.get("storage_problem")


def cluster_totals(nodes: list[dict]) -> dict:
    """``gpus``: every GPU known; ``gpus_available``: those of nodes that take new work
    (a lost node's GPU counted as idle capacity: manager trial)."""
    total = sum(len(n["gpus"]) for n in nodes)
    allocated = sum(min(1.0, g["allocated"]) for n in nodes for g in n["gpus"])
    return {"gpus": total, "gpus_available": sum(len(n["gpus"]) for n in nodes if takes_work(n)),
            "gpus_allocated": round(allocated, 3),
            "allocation": round(allocated / total, 3) if total else 0.0,
            "nodes": len(nodes), "nodes_alive": sum(1 for n in nodes if n["alive"])}
