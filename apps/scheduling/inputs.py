"""Building the policy's plain inputs from the database."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.utils import timezone

from apps.cluster.models import Node
from apps.jobs.models import HOLDING_STATES, Job, JobState
from apps.jobs.services import cluster_nodes

from .policy import Allocation, ClusterState, JobRequest, PolicyConfig


def walltime_estimate(job: Job) -> float:
    return float(job.timeout_s)


def cluster_state(now: datetime | None = None) -> tuple[ClusterState, dict[str, Job]]:
    now = now or timezone.now()
    nodes = [n for n in Node.objects.prefetch_related("gpus")]
    infos = cluster_nodes(nodes)
    alive = {n.name for n in nodes if n.is_alive(now)}
    infos = tuple(
        info if info.name in alive else type(info)(info.name, info.gpus, info.cpu_milli, info.memory_mb, False)
        for info in infos
    )
    running = []
    for job in Job.objects.filter(state__in=HOLDING_STATES, node__isnull=False).select_related("node", "team", "user"):
        started = (job.started_at or job.dispatched_at or now).timestamp()
        running.append(Allocation(
            job_id=str(job.pk), team=job.team.slug, user=job.user.username, node=job.node.name,
            gpu_indices=tuple(job.gpu_indices), gpu_share=job.gpu_share, gpu_memory_mb=job.gpu_memory_mb,
            cpu_milli=job.cpu_milli, memory_mb=job.memory_mb, priority_class=job.priority_class,
            started_at=started, expected_end=started + walltime_estimate(job),
            preemptible=job.checkpoints.exists(),
        ))
    queued_jobs = list(Job.objects.filter(state=JobState.QUEUED).select_related("team", "user"))
    queued = tuple(
        JobRequest(
            job_id=str(job.pk), team=job.team.slug, user=job.user.username,
            submitted_at=job.created_at.timestamp(), gpus=job.gpus, priority_class=job.priority_class,
            gpu_memory_mb=job.gpu_memory_mb, gpu_models=tuple(job.spec.get("gpu_models") or ()),
            cpu_milli=job.cpu_milli, memory_mb=job.memory_mb, timeout_s=float(job.timeout_s),
            walltime_s=walltime_estimate(job),
        )
        for job in queued_jobs
    )
    state = ClusterState(nodes=infos, running=tuple(running), queued=queued,
                         config=PolicyConfig(policy=getattr(settings, "SCHEDULER_POLICY", "fifo")))
    return state, {str(j.pk): j for j in queued_jobs}
