from __future__ import annotations

import re
from datetime import timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone

# A node's name, as gpu_worker takes it (lower case, "_" as "-"): a host name's characters,
# beginning and ending with a letter or digit. At most 80 characters, fewer than the column's
# 100: the worker's zygote listens on "@yoloportal-zygote-<name>-<pid>", and Linux holds at most
# 107 bytes of an abstract socket's name.
NODE_NAME = re.compile(r"[a-z0-9](?:[a-z0-9.-]*[a-z0-9])?")
NODE_NAME_MAX = 80


def node_name_problem(name: str) -> str:
    """Why ``name``, as typed, cannot name a node ("" when it can), saying the allowed form."""
    taken = name.lower().replace("_", "-")
    if NODE_NAME.fullmatch(taken) and len(taken) <= NODE_NAME_MAX:
        return ""
    return (f"{name!r} is not a node name: use letters, digits, '-', '_' and '.' (a host name), beginning "
            f"and ending with a letter or digit, at most {NODE_NAME_MAX} characters; e.g. gpu-07")


def suspect_after_s() -> float:
    """A node silent this long is *suspected* (``NODE_SUSPECT_S``, at most the grace period)."""
    return min(settings.NODE_SUSPECT_S, settings.NODE_GRACE_S)


def storage_problem_said(problem: str) -> str:
    """A node's ``storage_problem`` in the few words queued jobs' reasons and the dashboard show:
    its worker found the shared storage gone, or its JOBS_DIR full (worker.artifacts.jobs_dir_full)."""
    return "storage full" if problem.startswith("storage full") else "shared storage unreachable"


class Node(models.Model):
    class State(models.TextChoices):
        ACTIVE = "active"
        DRAINING = "draining"  # runs what it has, takes nothing new
        # Its worker got SIGTERM and its slots are exiting (≤ STOP_GRACE_S): nothing new is
        # placed; lost once they have (cluster.services.node_stopping, node_stopped).
        STOPPING = "stopping"
        LOST = "lost"  # silent past the grace period, or its worker stopped (cluster.services.node_stopped)

    class Executor(models.TextChoices):
        """How attempts placed here run (``worker/executors/``); the scheduler places for all."""

        LOCAL = "local"  # our gpu_worker: a process group in its own cgroup
        CONTAINER = "container"  # our gpu_worker: podman/docker run of the job's image
        SLURM = "slurm"  # a node of an existing Slurm cluster: sbatch from the slurm_agent

    name = models.SlugField(max_length=100, unique=True)
    state = models.CharField(max_length=10, choices=State.choices, default=State.ACTIVE)
    # Why an operator drained it (admin's Drain asks): queued jobs' reasons and the cluster view
    # show it beside "draining"; Resume clears it (trial 14, F6).
    drain_reason = models.CharField(max_length=200, blank=True)
    # Why the node cannot reach the shared DATA_DIR now (its mount dropped), as its worker last
    # found; "" when it can. Such a node takes no new work until it clears (worker/artifacts.py).
    storage_problem = models.CharField(max_length=500, blank=True)
    simulated = models.BooleanField(default=False, help_text="GPUs are simulated; training runs on CPU.")
    # What the node advertises to the scheduler (``gpu_worker --cpus/--memory`` may set more than the
    # machine has: an explicit overcommit); host_* is the machine itself, which enforced limits
    # (issue 12) never exceed.
    cpu_count = models.PositiveIntegerField(verbose_name="CPU count", default=0)
    memory_mb = models.PositiveIntegerField(verbose_name="memory (MiB)", default=0)
    host_cpu_count = models.PositiveIntegerField(verbose_name="host CPU count", default=0)
    host_memory_mb = models.PositiveIntegerField(verbose_name="host memory (MiB)", default=0)
    features = models.JSONField(default=list, blank=True, help_text='what it offers beyond GPUs, e.g. ["tensorrt"]')
    hostname = models.CharField(max_length=255, blank=True)
    worker_pid = models.PositiveIntegerField(verbose_name="worker PID", null=True, blank=True)
    registered_at = models.DateTimeField(auto_now_add=True)
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    executor = models.CharField(max_length=10, choices=Executor.choices, default=Executor.LOCAL)
    # Slurm nodes: the partition they were read from (the slurm_agent's pool).
    partition = models.CharField(max_length=100, blank=True)
    # Images (environments) this node can run; a job asking for another image is not placed here.
    images = models.JSONField(default=list, blank=True)
    # What the node enforces per attempt (worker/executors/cgroups.Host.as_dict()):
    # {"version": "v1", "enforced": ["memory", "cpu", "pids"], "summary": "..."}; {} = not reported.
    limits = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def queue_name(self) -> str:
        return f"node.{self.name}"

    @property
    def takes_work(self) -> bool:
        """Active and able to read the shared storage (responsiveness aside: is_responsive)."""
        return self.state == self.State.ACTIVE and not self.storage_problem

    @property
    def limits_enforced(self) -> bool:
        """Memory and CPU limits hold for each attempt here (a node that never said: no)."""
        return {"memory", "cpu"} <= set(self.limits.get("enforced") or ())

    @property
    def limits_summary(self) -> str:
        return self.limits.get("summary") or "limits not enforced (not reported by the node)"

    def is_alive(self, now=None) -> bool:
        """Reported within the grace period and not lost (a stopped worker's node is lost at once)."""
        now = now or timezone.now()
        return (
            self.state != self.State.LOST
            and self.last_heartbeat is not None
            and now - self.last_heartbeat <= timedelta(seconds=settings.NODE_GRACE_S)
        )

    def is_responsive(self, now=None) -> bool:
        """Reporting on time (silent for at most ``suspect_after_s()``).

        A node that is not is *suspected*: its worker may be dead, which only its grace
        period (``NODE_GRACE_S``, then ``lost``) decides. Until then it gets no new work and
        the attempts on it are left to the lost-node reaper, so one dead worker is one fault
        handled once. Its next heartbeat clears the suspicion.
        """
        now = now or timezone.now()
        return (
            self.last_heartbeat is not None
            and now - self.last_heartbeat <= timedelta(seconds=suspect_after_s())
        )


class GPU(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(verbose_name="UUID", max_length=100, blank=True)
    model = models.CharField(max_length=100, blank=True)
    memory_mb = models.PositiveIntegerField(verbose_name="memory (MiB)", default=0)
    memory_used_mb = models.PositiveIntegerField(verbose_name="memory used (MiB)", default=0)
    utilization = models.PositiveSmallIntegerField(default=0, help_text="percent")
    simulated = models.BooleanField(default=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name, verbose_name_plural = "GPU", "GPUs"
        ordering = ["node__name", "index"]
        constraints = [models.UniqueConstraint(fields=["node", "index"], name="one_gpu_per_index")]

    def __str__(self) -> str:
        label = " (simulated)" if self.simulated else ""
        return f"{self.node.name}:{self.index} {self.model}{label}"


class ForeignAllocation(models.Model):
    """Capacity taken on a node by work the portal did not start (a Slurm job submitted
    directly): the scheduler counts it as occupied, never preempts it, and shows it."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="foreign_allocations")
    external_id = models.CharField(max_length=100)
    description = models.CharField(max_length=200, blank=True)
    gpu_indices = models.JSONField(verbose_name="GPU indices",
                                   default=list, blank=True)  # logical GPUs it counts as holding here
    cpu_milli = models.PositiveIntegerField(verbose_name="CPU (millicores)", default=0)
    memory_mb = models.PositiveIntegerField(verbose_name="memory (MiB)", default=0)
    started_at = models.DateTimeField(null=True, blank=True)
    ends_at = models.DateTimeField(null=True, blank=True, help_text="its time limit, when it has one")
    seen_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["node__name", "external_id"]
        constraints = [models.UniqueConstraint(fields=["node", "external_id"], name="one_foreign_row_per_job")]

    def __str__(self) -> str:
        return f"{self.description or self.external_id} on {self.node.name}"
