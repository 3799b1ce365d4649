"""This host as a node: its facts go to ``apps.cluster.services`` at start and every heartbeat."""

from __future__ import annotations

import logging
import os
import socket
import threading

from django.db import close_old_connections

from apps.cluster.models import Node
from apps.cluster.services import node_heartbeat, node_register

from .inventory import GpuReading, host_memory_mb, nvml_gpus

log = logging.getLogger(__name__)


def register_this_host(*, name: str, gpus: list[GpuReading]) -> Node:
    """Register (or refresh) node ``name`` with this host's CPUs, memory, hostname and process."""
    return node_register(name=name, gpus=gpus, cpu_count=os.cpu_count() or 0, memory_mb=host_memory_mb(),
                         hostname=socket.gethostname(), worker_pid=os.getpid())


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
                node_heartbeat(self.node, gpus=None if self.simulated else nvml_gpus())
            except Exception as exc:  # noqa: BLE001 - keep beating through DB blips
                log.warning("heartbeat failed: %s", exc)

    def stop(self) -> None:
        self.stopped.set()
