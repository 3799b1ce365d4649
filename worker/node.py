"""Registering this node and keeping its heartbeat (in the database, not Redis)."""

from __future__ import annotations

import logging
import os
import socket
import threading

from django.db import close_old_connections, transaction
from django.utils import timezone

from apps.cluster.models import GPU, Node

from .inventory import GpuReading, host_memory_mb, nvml_gpus

log = logging.getLogger(__name__)


def node_register(*, name: str, gpus: list[GpuReading]) -> Node:
    """Create or refresh the node and its GPUs; a lost node that comes back is active again."""
    simulated = all(g.simulated for g in gpus)
    with transaction.atomic():
        node, _ = Node.objects.update_or_create(
            name=name,
            defaults={
                "simulated": simulated,
                "cpu_count": os.cpu_count() or 0,
                "memory_mb": host_memory_mb(),
                "hostname": socket.gethostname(),
                "worker_pid": os.getpid(),
                "last_heartbeat": timezone.now(),
            },
        )
        Node.objects.filter(pk=node.pk, state=Node.State.LOST).update(state=Node.State.ACTIVE)
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


def node_heartbeat(node: Node, *, refresh_gpus: bool) -> None:
    Node.objects.filter(pk=node.pk).update(last_heartbeat=timezone.now())
    # A node marked lost during a long pause comes back; its old attempts were requeued
    # and are fenced off, so it is safe to take new work again.
    if Node.objects.filter(pk=node.pk, state=Node.State.LOST).update(state=Node.State.ACTIVE):
        log.warning("node %s was marked lost; reporting again", node.name)
    if refresh_gpus:
        for g in nvml_gpus() or []:
            GPU.objects.filter(node=node, index=g.index).update(
                memory_used_mb=g.memory_used_mb, utilization=g.utilization)


class Heartbeat(threading.Thread):
    """Background thread in the worker's parent process. Its DB connection is its own."""

    def __init__(self, node: Node, interval_s: float, *, simulated: bool) -> None:
        super().__init__(name="heartbeat", daemon=True)
        self.node, self.interval_s, self.simulated = node, interval_s, simulated
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.interval_s):
            try:
                close_old_connections()
                node_heartbeat(self.node, refresh_gpus=not self.simulated)
            except Exception as exc:  # noqa: BLE001 - keep beating through DB blips
                log.warning("heartbeat failed: %s", exc)

    def stop(self) -> None:
        self.stopped.set()
