"""This host as a node: its facts go to ``apps.cluster.services`` at start and every heartbeat."""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable

from django.conf import settings
from django.db import close_old_connections

from apps.cluster.models import Node
from apps.cluster.services import node_heartbeat, node_register
from apps.core.storage import shared_filesystem

from .inventory import GpuReading, host_memory_mb, nvml_gpus

log = logging.getLogger(__name__)


def register_this_host(*, name: str, gpus: list[GpuReading], images: list[str] | None = None,
                       limits: dict | None = None, executor: str = Node.Executor.LOCAL, cpus: int | None = None,
                       memory_mb: int | None = None, features: list[str] | None = None) -> Node:
    """Register (or refresh) node ``name`` with this host's CPUs, memory, hostname and process.

    ``images`` default to ``NODE_IMAGES`` (the names this worker's own environment answers
    to); ``limits`` to what this host's cgroups enforce (probed here when not given).
    ``cpus``/``memory_mb`` are what the node *advertises* to the scheduler when an operator
    sets them (``gpu_worker --cpus 8 --memory 32Gi``), possibly more than the machine has:
    an explicit overcommit. The machine's own numbers are recorded beside them (host_*), and
    limits enforced on a job never exceed those. ``features`` defaults to what is detected
    here (``tensorrt`` on an NVIDIA node with the TensorRT runtime importable).
    """
    if limits is None:
        from .executors.cgroups import probe

        limits = probe().as_dict() if settings.ATTEMPT_CGROUPS else {
            "version": "", "enforced": [], "summary": "limits not enforced (ATTEMPT_CGROUPS=false)"}
    host_cpus, host_memory = os.cpu_count() or 0, host_memory_mb()
    return node_register(name=name, gpus=gpus, cpu_count=cpus or host_cpus, memory_mb=memory_mb or host_memory,
                         host_cpu_count=host_cpus, host_memory_mb=host_memory,
                         features=detect_features(gpus) if features is None else features,
                         hostname=socket.gethostname(), worker_pid=os.getpid(), executor=executor,
                         images=settings.NODE_IMAGES if images is None else images, limits=limits)


def detect_features(gpus: list[GpuReading]) -> list[str]:
    """``tensorrt`` where a real NVIDIA GPU and the TensorRT runtime are both here (checked without importing it)."""
    import importlib.util

    real = any(not g.simulated for g in gpus)
    return ["tensorrt"] if real and importlib.util.find_spec("tensorrt") is not None else []


class Heartbeat(threading.Thread):
    """Background thread in the worker's parent process. Its DB connection is its own.

    ``register`` (the worker's own registration, again) is called when a beat finds the
    node's row gone, deleted in admin while this worker runs: the node is registered anew
    and :attr:`node` becomes the new row, which the worker reads from here when it stops.
    Before, the worker beat into nothing, unseen by the scheduler and the node-lost alert.
    """

    def __init__(self, node: Node, interval_s: float, *, simulated: bool,
                 register: Callable[[], Node] | None = None) -> None:
        super().__init__(name="heartbeat", daemon=True)
        self.node, self.interval_s, self.simulated, self.register = node, interval_s, simulated, register
        self.stopped = threading.Event()
        self.storage_lost = False  # the last beat found the shared storage unreadable (said once in the log)

    def run(self) -> None:
        while not self.stopped.wait(self.interval_s):
            try:
                close_old_connections()
                self.beat()
            except Exception as exc:  # noqa: BLE001 - keep beating through DB blips
                log.warning("heartbeat failed: %s", exc)

    def beat(self) -> None:
        if node_heartbeat(self.node, gpus=None if self.simulated else nvml_gpus(), storage_problem=self.storage()):
            return
        if self.register is None:
            log.warning("node %s: its row is gone (deleted in admin?); nothing to report to", self.node.name)
            return
        log.warning("node %s: its row was deleted while this worker runs (in admin?); registering it again",
                    self.node.name)
        self.node = self.register()

    def storage(self) -> str | None:
        """What this beat reports of the shared storage ('' = readable; None with an object store).

        Each beat looks, as the worker did at its start (worker/artifacts.py): a mount that
        dropped since then takes the node out of the scheduler's placements until it is back.
        """
        from .artifacts import jobs_dir_full, shared_storage_lost, shared_storage_problem

        if not shared_filesystem():
            return jobs_dir_full()  # its scratch JOBS_DIR (run folders) may fill up all the same
        problem = shared_storage_lost()
        if problem and not self.storage_lost:  # the path it lacks (node_storage_problem_set logs the change)
            log.warning("node %s: %s", self.node.name, shared_storage_problem() or problem)
        self.storage_lost = bool(problem)
        return problem or jobs_dir_full()

    def stop(self) -> None:
        self.stopped.set()
