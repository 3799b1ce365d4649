"""Admission at submit time: a job that could never start is refused with the reason.

The one place that asks "may this job ever run here?" for a submit; ``apps.jobs.services``
calls :func:`job_admission_errors`. The rules themselves are the pure policy's
(``policy.admission.limit_error``, ``policy.placement.fits_empty_cluster``).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass, replace

from django.conf import settings
from django.db import transaction

from apps.cluster.models import Node

from .inputs import cluster_nodes, team_policies
from .models import SchedulerConfig
from .policy import JobRequest, NodeInfo, PolicyConfig, TeamPolicy
from .policy.admission import limit_error
from .policy.placement import fits_empty_cluster


@dataclass(frozen=True)
class AdmissionInputs:
    nodes: tuple[NodeInfo, ...]
    images: frozenset[str]
    largest_node_gpus: int
    config: PolicyConfig
    teams: dict[str, TeamPolicy]
    # job_admission_errors' answers for these inputs, by the request's shape: most submits ask
    # the same few questions, and placing a job on every node made idle is per submit otherwise.
    answers: dict[tuple, dict[str, str]] = dataclasses.field(default_factory=dict, compare=False, repr=False)


ANSWERS_KEPT = 1024  # shapes remembered per AdmissionInputs (then forgotten all at once)


_cached: tuple[float, AdmissionInputs] | None = None
_generation = 0  # counts clears: a read that a clear overtook is used once, not kept
_lock = threading.Lock()


def admission_inputs() -> AdmissionInputs:
    """The cluster's shape, the scheduler configuration and the team quotas, as submit needs them.

    Every submit asks; they change rarely. Read at most every ``ADMISSION_CACHE_S`` seconds
    per process (five queries and the policy objects otherwise), and afresh at once after a
    change saved in this process (:func:`admission_inputs_changed`, wired to the models'
    signals in ``apps.py``). A node registered by a worker, or a quota changed on another
    web process, is seen by submit within ``ADMISSION_CACHE_S``; the scheduler reads them
    afresh on every pass regardless.
    """
    global _cached
    now = time.monotonic()
    cached = _cached
    if cached is not None and now - cached[0] < settings.ADMISSION_CACHE_S:
        return cached[1]
    with _lock:
        # Threads that found it stale together: the first reads, the others use its result.
        cached = _cached
        if cached is not None and time.monotonic() - cached[0] < settings.ADMISSION_CACHE_S:
            return cached[1]
        for _ in range(2):
            # A change saved while we read (see admission_inputs_changed) may be missing
            # from what we read: read once more (the first read may have created the
            # configuration row itself), and keep nothing if it came again.
            generation = _generation
            inputs = _read_inputs()
            if generation == _generation:
                _cached = (time.monotonic(), inputs)
                break
    return inputs


def _read_inputs() -> AdmissionInputs:
    nodes = list(Node.objects.prefetch_related("gpus"))
    config = SchedulerConfig.current().to_policy()
    return AdmissionInputs(
        nodes=cluster_nodes(nodes),
        images=frozenset(image for n in nodes for image in n.images or ()),
        largest_node_gpus=max((len(n.gpus.all()) for n in nodes), default=0),
        config=config,
        teams=team_policies(config),
    )


def admission_inputs_changed(using: str | None = None, **_) -> None:
    """A model admission reads was saved: forget, now and again when its transaction commits.

    The signals fire inside the saving transaction, so another thread may read (and keep)
    the old rows between the save and the commit; the second clear drops that copy.
    """
    admission_cache_clear()
    transaction.on_commit(admission_cache_clear, using=using)


def admission_cache_clear() -> None:
    global _cached, _generation
    _generation += 1
    _cached = None


def job_admission_errors(request: JobRequest, *, team_known: bool) -> dict[str, str]:
    """Why ``request`` can never start, as field → message; empty if it can.

    1. With no node registered yet nothing is judged (the cluster is still coming up).
    2. Its ``image``: some node must run it (``image``, naming the images there are).
    3. The per-job and per-team GPU limits (SchedulerConfig, TeamQuota), when the team is
       known (``team_known``): ``resources.gpu``.
    4. A node feature it needs that no node offers is left to the submit's check of the
       argument that needs it (``apps.jobs.inputs``), which names that field.
    5. Otherwise, whether any node could hold it when empty: the one resource no node has
       even alone (``resources.gpu``, ``resources.gpu_model``, ``resources.gpu_memory``,
       ``resources.memory``, ``resources.cpu``, naming what the nodes have), else the
       combination (``resources``).
    """
    inputs = admission_inputs()
    if not inputs.nodes:
        return {}
    # Everything below reads only these fields of the request (and the inputs).
    shape = (team_known, request.team if team_known else None, request.gpus, request.gpu_memory_mb,
             request.gpu_models, request.cpu_milli, request.memory_mb, request.image, request.requires)
    answer = inputs.answers.get(shape)
    if answer is None:
        if len(inputs.answers) >= ANSWERS_KEPT:
            inputs.answers.clear()
        answer = inputs.answers[shape] = _admission_errors(request, inputs, team_known=team_known)
    return dict(answer)


def _admission_errors(request: JobRequest, inputs: AdmissionInputs, *, team_known: bool) -> dict[str, str]:
    """:func:`job_admission_errors`' answer, worked out (steps 2–5)."""
    if request.image:
        available = sorted(inputs.images)
        if request.image not in available:
            return {"image": (f"no node runs image {request.image!r}; available: "
                              f"{', '.join(available) if available else 'none (no node lists an image)'}")}
    if team_known:
        if limit := limit_error(request, inputs.config, inputs.teams):
            return {"resources.gpu": limit}
    if request.requires and not any(set(request.requires) <= set(node.features) for node in inputs.nodes):
        # No node offers what it needs (TensorRT, a real GPU): submit's own check says so under the
        # field that asks for it (apps.jobs.inputs: format=engine, half=true), not again as a size.
        return {}
    if fits_empty_cluster(inputs.nodes, request):
        return {}
    if alone := short_alone(inputs.nodes, request):
        return alone
    largest = inputs.largest_node_gpus
    return {"resources": (
        f"no node can ever run this: asks for {request.gpus:g} GPU(s)"
        f"{' of model ' + '/'.join(request.gpu_models) if request.gpu_models else ''}"
        f"{f', {request.gpu_memory_mb} MiB GPU memory' if request.gpu_memory_mb else ''}"
        f"{f', {request.memory_mb} MiB RAM' if request.memory_mb else ''}"
        f"{f', {request.cpu_milli / 1000:g} CPUs' if request.cpu_milli else ''}"
        f"{f' in image {request.image}' if request.image else ''}"
        f"{f', a node with {chr(32).join(request.requires)}' if request.requires else ''}"
        f"; the largest node has {largest} GPU(s)"
    )}


def short_alone(nodes: tuple[NodeInfo, ...], request: JobRequest) -> dict[str, str]:
    """The first resource that no node has enough of even with nothing else asked (beside the
    GPUs), as field → message naming what the nodes do have; empty when only the combination
    does not fit. (One message naming the largest node's GPU count was given for all of them,
    even when the RAM asked was the problem.)"""
    gpus = request.gpus
    alone = JobRequest(request.job_id, request.team, request.user, request.submitted_at, gpus=gpus)
    n = int(gpus) if gpus >= 1 else 1
    every_gpu = [g for node in nodes for g in node.gpus]
    checks = (
        ("resources.gpu", alone, lambda: (
            f"asks for {gpus:g} GPUs on one node; the largest node has {max((len(x.gpus) for x in nodes), default=0)}")),
        ("resources.gpu_model", replace(alone, gpu_models=request.gpu_models), lambda: (
            f"no node has {n} GPU(s) of model {' or '.join(request.gpu_models)}; the models here: "
            f"{', '.join(sorted({g.model for g in every_gpu})) or 'none'}")),
        ("resources.gpu_memory", replace(alone, gpu_memory_mb=request.gpu_memory_mb), lambda: (
            f"no node has {n} GPU(s) with {request.gpu_memory_mb} MiB of memory; the largest "
            f"GPU has {max((g.memory_mb for g in every_gpu), default=0)} MiB")),
        ("resources.memory", replace(alone, memory_mb=request.memory_mb), lambda: (
            f"asks for {request.memory_mb} MiB of RAM; the largest node has "
            f"{max((x.memory_mb for x in nodes), default=0)} MiB")),
        ("resources.cpu", replace(alone, cpu_milli=request.cpu_milli), lambda: (
            f"asks for {request.cpu_milli / 1000:g} CPUs; the largest node has "
            f"{max((x.cpu_milli for x in nodes), default=0) / 1000:g}")),
    )
    for field, asked, message in checks:
        if not fits_empty_cluster(nodes, asked):
            return {field: message()}
    return {}
