"""Admission at submit time: a job that could never start is refused with the reason.

The one place that asks "may this job ever run here?" for a submit; ``apps.jobs.services``
calls :func:`job_admission_errors`. The rules themselves are the pure policy's
(``policy.admission.limit_error``, ``policy.placement.fits_empty_cluster``).
"""

from __future__ import annotations

from apps.cluster.models import Node

from .inputs import cluster_nodes, team_policies
from .models import SchedulerConfig
from .policy import JobRequest
from .policy.admission import limit_error
from .policy.placement import fits_empty_cluster


def job_admission_errors(request: JobRequest, *, team_known: bool) -> dict[str, str]:
    """Why ``request`` can never start, as field → message; empty if it can.

    1. With no node registered yet nothing is judged (the cluster is still coming up).
    2. Its ``image``: some node must run it (``image``, naming the images there are).
    3. The per-job and per-team GPU limits (SchedulerConfig, TeamQuota), when the team is
       known (``team_known``): ``resources.gpu``.
    4. Otherwise, whether any node could hold it when empty: ``resources``.
    """
    nodes = list(Node.objects.prefetch_related("gpus"))
    if not nodes:
        return {}
    if request.image:
        available = sorted({image for n in nodes for image in n.images or ()})
        if request.image not in available:
            return {"image": (f"no node runs image {request.image!r}; available: "
                              f"{', '.join(available) if available else 'none (no node lists an image)'}")}
    if team_known:
        config = SchedulerConfig.current().to_policy()
        if limit := limit_error(request, config, team_policies(config)):
            return {"resources.gpu": limit}
    if fits_empty_cluster(cluster_nodes(nodes), request):
        return {}
    largest = max(n.gpus.count() for n in nodes)
    return {"resources": (
        f"no node can ever run this: asks for {request.gpus:g} GPU(s)"
        f"{' of model ' + '/'.join(request.gpu_models) if request.gpu_models else ''}"
        f"{f', {request.gpu_memory_mb} MiB GPU memory' if request.gpu_memory_mb else ''}"
        f"{f', {request.memory_mb} MiB RAM' if request.memory_mb else ''}"
        f"{f', {request.cpu_milli / 1000:g} CPUs' if request.cpu_milli else ''}"
        f"{f' in image {request.image}' if request.image else ''}"
        f"; the largest node has {largest} GPU(s)"
    )}
