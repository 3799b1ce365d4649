"""Writes about nodes: registration and heartbeats (in the database, not Redis).

The GPU worker process gathers the facts (``worker/inventory.py``) and reports them here;
a node becomes lost when the scheduler's reaper finds it silent past its grace period, or
at once when its worker says it stopped (``node_stopped``; from its SIGTERM until then it is
``stopping``: nothing new is placed on it, ``node_stopping``). Either way the reaper then
requeues what the node held (apps.scheduling.loop.reap_lost_nodes).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Case, Value, When
from django.utils import timezone

from .models import GPU, ForeignAllocation, Node

log = logging.getLogger(__name__)


class GpuFacts(Protocol):
    """One GPU as the worker reads it (``worker.inventory.GpuReading`` is one)."""

    index: int
    uuid: str
    model: str
    memory_mb: int
    memory_used_mb: int
    utilization: int
    simulated: bool


def back_state() -> Case:
    """The state of a node whose worker reports again: active, or draining while an operator's
    drain is in force (its reason stays until Resume). A drained node whose worker was stopped
    for the maintenance came back active at its restart and took work (operator trial 20, F4):
    Kubernetes keeps a cordon, Slurm a drain, across a restart of their node agent."""
    return Case(When(drain_reason="", then=Value(Node.State.ACTIVE)), default=Value(Node.State.DRAINING))


def node_register(*, name: str, gpus: Sequence[GpuFacts], cpu_count: int, memory_mb: int, hostname: str,
                  worker_pid: int | None, executor: str = Node.Executor.LOCAL, images: Sequence[str] = (),
                  limits: dict | None = None, partition: str = "", host_cpu_count: int | None = None,
                  host_memory_mb: int | None = None, features: Sequence[str] = (), storage_problem: str = "") -> Node:
    """Create or refresh the node and its GPUs; a lost node that comes back is active again
    (draining, if an operator drained it and has not resumed it: :func:`back_state`).

    ``images``: the images (environments) the node runs; ``limits``: what it enforces per
    attempt (``worker.executors.cgroups.Host.as_dict()``), shown in the cluster view.
    ``cpu_count``/``memory_mb`` are what it advertises (maybe more than ``host_*``, the
    machine's own: an operator's explicit overcommit); ``features``: e.g. ``tensorrt``;
    ``storage_problem``: why it cannot read the shared storage ('' = it can: a worker checked
    before registering; the Slurm agent re-registers its nodes with what it found).
    """
    simulated = all(g.simulated for g in gpus)
    with transaction.atomic():
        node, _ = Node.objects.update_or_create(
            name=name,
            defaults={
                "simulated": simulated,
                "cpu_count": cpu_count,
                "memory_mb": memory_mb,
                "host_cpu_count": cpu_count if host_cpu_count is None else host_cpu_count,
                "host_memory_mb": memory_mb if host_memory_mb is None else host_memory_mb,
                "features": sorted(set(features)),
                "hostname": hostname,
                "worker_pid": worker_pid,
                "last_heartbeat": timezone.now(),
                "executor": executor,
                "images": sorted(set(images)),
                "limits": limits or {},
                "partition": partition,
                "storage_problem": storage_problem[:Node._meta.get_field("storage_problem").max_length],
            },
        )
        Node.objects.filter(pk=node.pk, state__in=[Node.State.LOST, Node.State.STOPPING]).update(state=back_state())
        GPU.objects.filter(node=node).exclude(index__in=[g.index for g in gpus]).delete()
        for g in gpus:
            GPU.objects.update_or_create(
                node=node, index=g.index,
                defaults={"uuid": g.uuid, "model": g.model, "memory_mb": g.memory_mb,
                          "memory_used_mb": g.memory_used_mb, "utilization": g.utilization,
                          "simulated": g.simulated},
            )
    node.refresh_from_db()
    return node


def node_heartbeat(node: Node, *, gpus: Sequence[GpuFacts] | None = None, storage_problem: str | None = None) -> bool:
    """The node's worker is alive; ``gpus``, when given, refresh their memory use and utilization;
    ``storage_problem``, when given, is what it found of the shared storage ('' = reachable:
    :func:`node_storage_problem_set`).

    False if the node's row is gone (deleted in admin while its worker ran): the worker must
    register it again (``worker.node.Heartbeat``), or it would beat into nothing, unseen by
    the scheduler and by the node-lost alert.
    """
    if not Node.objects.filter(pk=node.pk).update(last_heartbeat=timezone.now()):
        return False
    # A node marked lost during a long pause comes back; its old attempts were requeued
    # and are fenced off, so it is safe to take new work again.
    if Node.objects.filter(pk=node.pk, state=Node.State.LOST).update(state=back_state()):
        log.warning("node %s was marked lost; reporting again", node.name)
    for g in gpus or []:
        GPU.objects.filter(node=node, index=g.index).update(memory_used_mb=g.memory_used_mb, utilization=g.utilization)
    if storage_problem is not None:
        node_storage_problem_set(node, problem=storage_problem)
    return True


def node_storage_problem_set(node: Node, *, problem: str) -> bool:
    """The node's worker found the shared storage gone (``problem``: why) or back (''). True if
    this changed the node.

    A node that lost its mount of the shared DATA_DIR took jobs and failed each one as a "dataset
    problem". While ``storage_problem`` is set it is not schedulable (apps.scheduling.inputs), its
    queued jobs' reasons and the cluster view say why, and /metrics shows it; its heartbeat clears
    it once the storage is readable again. Its state is left alone: an operator's drain is theirs.
    """
    problem = problem[:Node._meta.get_field("storage_problem").max_length]
    changed = Node.objects.filter(pk=node.pk).exclude(storage_problem=problem).update(storage_problem=problem) == 1
    if changed and problem:
        log.warning("node %s has a storage problem; it takes no new work until it is gone: %s", node.name, problem)
    elif changed:
        log.warning("node %s: its storage problem is gone (the shared storage is readable, JOBS_DIR has room); it "
                    "takes work again", node.name)
    node.storage_problem = problem
    return changed


def node_delete_refusal(node: Node, *, now: datetime | None = None) -> str | None:
    """Why the node's row may not be deleted now, or None.

    A node whose worker still reports, or that holds attempts, would lose them silently:
    its worker's heartbeats hit no row, its jobs' GPUs vanish from the scheduler's view and
    the node-lost alert has no node to fire for (trial 14, F28).
    """
    from apps.jobs.models import HOLDING_STATES

    now = now or timezone.now()
    holding = node.jobs.filter(state__in=HOLDING_STATES).count()
    if holding:
        return (f"node {node.name} holds {holding} starting or running job(s): drain it (admin action Drain), "
                f"wait for them to end or cancel them, and stop its worker first")
    if node.last_heartbeat is not None and node.state != Node.State.LOST:
        silent_s = (now - node.last_heartbeat).total_seconds()
        if silent_s <= settings.NODE_GRACE_S:
            return (f"node {node.name} reported {silent_s:.0f} s ago (within NODE_GRACE_S={settings.NODE_GRACE_S:g} "
                    f"s): its worker is alive; drain it and stop its worker first (a stopped worker's node is "
                    f"lost at once)")
    return None


def node_delete(*, node: Node) -> None:
    """Delete a node whose worker is gone and that holds nothing (decommissioning it)."""
    refusal = node_delete_refusal(node)
    if refusal:
        raise ValidationError(refusal)
    node.delete()


def node_mark_lost(node: Node, *, silent_since: datetime) -> bool:
    """Mark the node lost if it has still not reported since ``silent_since``. True if this call did
    (False: it heartbeated just now, or it was already lost)."""
    return Node.objects.filter(pk=node.pk, last_heartbeat__lt=silent_since).exclude(
        state=Node.State.LOST).update(state=Node.State.LOST) == 1


def node_stopping(node: Node, *, hostname: str, worker_pid: int) -> bool:
    """The node's worker was told to stop (SIGTERM): place nothing new on it from now on.

    Its slots are exiting, which takes up to ``gpu_worker.STOP_GRACE_S``; only then is it
    lost (``node_stopped``) and what it held requeued. Before this, the scheduler could still
    place a job there in that window (the reaper took it back after). Only an active node
    (a draining one takes nothing new already), and only by the worker process that
    registered it last, as for ``node_stopped``; a heartbeat does not undo it, the node's
    next registration does. True if this call marked it.
    """
    marked = Node.objects.filter(pk=node.pk, hostname=hostname, worker_pid=worker_pid,
                                 state=Node.State.ACTIVE).update(state=Node.State.STOPPING) == 1
    if marked:
        log.info("node %s is stopping (its worker got SIGTERM); no new work", node.name)
    return marked


def node_stopped(node: Node, *, hostname: str, worker_pid: int) -> bool:
    """The node's worker stopped cleanly and nothing of it runs any more: the node is lost now,
    not after ``NODE_GRACE_S`` of silence. True if this call marked it.

    Only the worker process that registered the node last may say so (``hostname`` and
    ``worker_pid``): a successor already started under the same name keeps it. The caller
    must have stopped its heartbeat first, or a last beat would revive the node. Its next
    registration makes it active again (``node_register``), as for any lost node.
    """
    marked = Node.objects.filter(pk=node.pk, hostname=hostname, worker_pid=worker_pid).exclude(
        state=Node.State.LOST).update(state=Node.State.LOST) == 1
    if marked:
        log.info("node %s stopped (its worker shut down); marked lost", node.name)
    return marked


def node_drain(*, node: Node, reason: str) -> bool:
    """An operator drains an active node: it runs what it has and starts nothing new; ``reason``
    (required: trial 14, F6) is shown wherever the draining is explained (queued jobs' reasons,
    the cluster view). A draining node given another reason keeps draining with the new one.
    True if this call changed the node."""
    reason = reason.strip()
    if not reason:
        raise ValidationError({"reason": "say why the node is drained (shown to users waiting for it)"})
    changed = Node.objects.filter(pk=node.pk, state__in=[Node.State.ACTIVE, Node.State.DRAINING]).exclude(
        state=Node.State.DRAINING, drain_reason=reason).update(state=Node.State.DRAINING, drain_reason=reason)
    if changed:
        log.warning("node %s is draining: %s", node.name, reason)
    return bool(changed)


def node_resume(*, node: Node) -> bool:
    """A draining node takes new work again; its drain reason goes. True if this call resumed it."""
    changed = Node.objects.filter(pk=node.pk, state=Node.State.DRAINING).update(state=Node.State.ACTIVE,
                                                                                drain_reason="")
    if changed:
        log.warning("node %s is active again", node.name)
    return bool(changed)


def node_state_set(node: Node, *, schedulable: bool, reason: str = "") -> bool:
    """An outside manager (Slurm) says whether the node takes work: active ↔ draining.

    A lost node stays lost until it reports again. True if the state changed.
    """
    if schedulable:
        changed = Node.objects.filter(pk=node.pk, state=Node.State.DRAINING).update(state=Node.State.ACTIVE)
    else:
        changed = Node.objects.filter(pk=node.pk, state=Node.State.ACTIVE).update(state=Node.State.DRAINING)
    if changed:
        log.warning("node %s is %s%s", node.name, "active again" if schedulable else "draining",
                    f" ({reason})" if reason else "")
    return bool(changed)


def node_foreign_set(node: Node, allocations: Sequence[dict]) -> None:
    """Replace what the node runs outside the portal (``ForeignAllocation`` fields per row)."""
    keep = [a["external_id"] for a in allocations]
    with transaction.atomic():
        ForeignAllocation.objects.filter(node=node).exclude(external_id__in=keep).delete()
        for row in allocations:
            ForeignAllocation.objects.update_or_create(
                node=node, external_id=row["external_id"],
                defaults={k: v for k, v in row.items() if k != "external_id"})
