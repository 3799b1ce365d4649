"""The Slurm executor: a node pool that is a partition of an existing Slurm cluster.

The portal's scheduler keeps its own fair policy and places jobs on the partition's nodes
like on any other; Slurm only runs what it is handed, pinned where the scheduler chose.
``manage.py slurm_agent --partition P`` runs where the Slurm client commands work (a login
node with munge), with database access; the Slurm nodes themselves get none:

1. **Nodes** (every ``SLURM_SYNC_S``): ``sinfo --json`` → each node of the partition is
   registered (CPUs, memory, GPUs from GRES; executor ``slurm``) and heartbeated; a node
   Slurm has down or drained is draining here. Jobs in ``squeue`` that the portal did not
   start are recorded as occupied capacity (``ForeignAllocation``).
2. **Start**: an attempt the scheduler placed on a Slurm node (``starting``) is started
   (fenced, as by a worker) and submitted with ``sbatch --nodelist=<node> --gres=gpu:N
   --cpus-per-task --mem --time --signal=B:USR1@… --export=NONE``. The batch script runs
   :mod:`worker.executors.relay`: the same training child, plus a relay that posts its
   events and output to ``/api/v1/attempts/<id>/report/`` with a token scoped to that one
   attempt (it expires with it). Inputs and results go through the shared filesystem
   (``JOBS_DIR``, datasets, weights at the same paths on the Slurm nodes).
3. **Watch** (every ``SLURM_POLL_S``): ``squeue --json -t all`` for our jobs (``yp-<attempt>``).
   Pending past ``SLURM_PENDING_LIMIT_S``: withdrawn (``scancel``) and requeued through the
   portal. A cancel asked in the portal, or an attempt no longer current: ``scancel`` (once:
   :meth:`SlurmAgent.cancel`); but a
   running attempt preempted with a grace is left to its relay, which stops the training at
   its epoch end (the portal answers its reports "preempted"), until the grace is over (plus
   :data:`SLURM_STOP_MARGIN_S`).
4. **End**: ``NODE_FAIL``/``PREEMPTED``/``BOOT_FAIL`` → requeued from the checkpoint as the
   next attempt (not a retry); ``TIMEOUT`` → timed_out; ``OUT_OF_MEMORY`` → failed with the
   reason; otherwise the relay's final report decides, exactly as for a local attempt.

No accounting database is needed: ended jobs stay in ``squeue -t all`` for ``MinJobAge``
(300 s by default); one that vanished before the agent saw its end is treated as lost.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, close_old_connections
from django.db.models import Sum
from django.utils import timezone

from apps.cluster.models import Node
from apps.cluster.services import node_foreign_set, node_register, node_state_set, node_storage_problem_set
from apps.core.artifacts import ROOTS
from apps.core.storage_marks import storage_marks_expected
from apps.jobs.models import HOLDING_STATES, Checkpoint, ExecutorAttempt, Job, JobEvent, JobState
from apps.jobs.paths import traceback_strip
from apps.jobs.services import (
    attempt_finish,
    attempt_heartbeat,
    attempt_lost,
    attempt_previous_stop,
    attempt_resume_choose,
    attempt_start,
    attempt_stop_by,
    attempt_token_issue,
    infra_requeues_left,
    job_event,
    job_requeue,
    previous_stop_silent_said,
    previous_stop_wait_said,
)
from apps.quotas.models import UsageRecord
from apps.quotas.services import usage_charge
from apps.scheduling.kick import kick_scheduler

from .base import error_lines, oom_message
from .cgroups import Usage

log = logging.getLogger("yoloportal.slurm")

JOB_PREFIX = "yp-"
REQUEUE_STATES = {"NODE_FAIL", "PREEMPTED", "BOOT_FAIL"}
ENDED_STATES = REQUEUE_STATES | {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "DEADLINE",
                                 "SPECIAL_EXIT", "REVOKED"}
BUSY_NODE_STATES = {"down", "drain", "drained", "draining", "fail", "failing", "future", "maint", "not_responding",
                    "power_down", "powered_down", "reboot_requested", "unknown"}


class AttemptTakenAway(Exception):
    """The attempt stopped being current before its batch was submitted (SlurmAgent.prepare)."""


class SlurmError(Exception):
    """A Slurm command failed (its stderr is the message)."""


# --------------------------------------------------------------------------- reading Slurm


@dataclass(frozen=True)
class SlurmNode:
    name: str
    hostname: str
    cpus: int
    memory_mb: int
    gpus: int
    gpu_model: str
    state: str  # Slurm's word, lower case ("idle", "mixed", "down", "drained", ...)
    partitions: tuple[str, ...]

    @property
    def schedulable(self) -> bool:
        words = set(re.split(r"[+\s]+", self.state.lower()))
        return not words & BUSY_NODE_STATES


@dataclass(frozen=True)
class SlurmJob:
    job_id: str
    name: str
    state: str  # PENDING, RUNNING, COMPLETED, NODE_FAIL, ...
    reason: str
    nodes: str
    partition: str
    cpus: int
    memory_mb: int
    gpus: int
    submit_time: float
    start_time: float
    end_time: float
    time_limit_min: int | None
    exit_code: int | None

    @property
    def ours(self) -> bool:
        return self.name.startswith(JOB_PREFIX)


def parse_gres(text: str | None) -> tuple[int, str]:
    """``gpu:8`` → (8, ""), ``gpu:a100:4(S:0-1)`` → (4, "a100"); other GRES are ignored."""
    count, model = 0, ""
    for part in re.split(r",(?![^(]*\))", text or ""):
        part = re.sub(r"\(.*\)$", "", part.strip())
        bits = part.split(":")
        if not bits or bits[0] not in ("gpu", "gres/gpu"):
            continue
        if len(bits) == 2 and bits[1].isdigit():
            count += int(bits[1])
        elif len(bits) == 3 and bits[2].isdigit():
            count += int(bits[2])
            model = model or bits[1]
    return count, model


def job_gpus(raw: dict) -> int:
    """GPUs a job holds (or asks for): its GRES detail when allocated, else what it requested."""
    details = raw.get("gres_detail") or []
    if details:
        return sum(parse_gres(d)[0] for d in details)
    for key in ("tres_per_node", "tres_per_job", "tres_req_str", "tres_alloc_str"):
        value = raw.get(key) or ""
        match = re.search(r"gres[/:]gpu(?::[\w.-]+)?[:=](\d+)", value)
        if match:
            return int(match.group(1))
    return 0


def parse_nodes(payload: dict, partition: str) -> list[SlurmNode]:
    nodes = []
    for raw in payload.get("nodes") or []:
        partitions = tuple(raw.get("partitions") or ())
        if partition and partition not in partitions:
            continue
        count, model = parse_gres(raw.get("gres"))
        state = raw.get("state") or ""
        flags = raw.get("state_flags") or []
        nodes.append(SlurmNode(
            name=raw["name"], hostname=raw.get("hostname") or raw["name"], cpus=int(raw.get("cpus") or 0),
            memory_mb=int(raw.get("real_memory") or 0), gpus=count, gpu_model=model,
            state="+".join([str(state).lower(), *[str(f).lower() for f in flags]]), partitions=partitions,
        ))
    return nodes


def _number(value) -> float:
    if isinstance(value, dict):  # newer Slurm: {"set": true, "number": N}
        return float(value.get("number") or 0) if value.get("set", True) else 0.0
    return float(value or 0)


def parse_jobs(payload: dict) -> list[SlurmJob]:
    jobs = []
    for raw in payload.get("jobs") or []:
        state = raw.get("job_state") or ""
        if isinstance(state, list):
            state = state[0] if state else ""
        limit = raw.get("time_limit")
        exit_code = raw.get("exit_code")
        if isinstance(exit_code, dict):
            exit_code = exit_code.get("return_code", {}).get("number") if isinstance(
                exit_code.get("return_code"), dict) else exit_code.get("return_code")
        memory = raw.get("memory_per_node") or 0
        if isinstance(memory, dict):
            memory = _number(memory)
        jobs.append(SlurmJob(
            job_id=str(raw["job_id"]), name=raw.get("name") or "", state=str(state).upper(),
            reason=str(raw.get("state_reason") or ""), nodes=raw.get("nodes") or "",
            partition=raw.get("partition") or "", cpus=int(_number(raw.get("cpus"))), memory_mb=int(memory),
            gpus=job_gpus(raw), submit_time=_number(raw.get("submit_time")),
            start_time=_number(raw.get("start_time")), end_time=_number(raw.get("end_time")),
            time_limit_min=int(_number(limit)) if limit not in (None, "") else None,
            exit_code=int(exit_code) if isinstance(exit_code, (int, float)) else None,
        ))
    return jobs


class SlurmClient:
    """The Slurm commands the executor uses (``SLURM_CONF`` and munge from the environment)."""

    def __init__(self, timeout_s: float = 30.0) -> None:
        self.timeout_s = timeout_s

    def _run(self, *command: str) -> str:
        try:
            done = subprocess.run(list(command), capture_output=True, text=True, timeout=self.timeout_s)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SlurmError(f"{command[0]}: {exc}") from exc
        if done.returncode != 0:
            raise SlurmError(f"{shlex.join(command)}: {(done.stderr or done.stdout).strip()[:500]}")
        return done.stdout

    def nodes(self, partition: str) -> list[SlurmNode]:
        return parse_nodes(json.loads(self._run("sinfo", "--json")), partition)

    def jobs(self) -> list[SlurmJob]:
        return parse_jobs(json.loads(self._run("squeue", "--json", "--states=all")))

    def submit(self, options: list[str], script: Path) -> str:
        out = self._run("sbatch", "--parsable", *options, str(script))
        return out.strip().split(";")[0]

    def cancel(self, job_id: str) -> None:
        self._run("scancel", job_id)

    def task_plugin(self) -> str:
        match = re.search(r"^TaskPlugin\s*=\s*(\S+)", self._run("scontrol", "show", "config"), re.M)
        return match.group(1) if match else ""


def node_name(slurm_name: str) -> str:
    """The portal's name for a Slurm node (a slug); Slurm's own name is kept as the hostname."""
    return re.sub(r"[^a-z0-9-]+", "-", slurm_name.lower()).strip("-") or "slurm-node"


# --------------------------------------------------------------------------- one attempt


def sbatch_options(*, job: Job, partition: str, slurm_node: str, attempt_dir: Path, time_s: float) -> list[str]:
    """Pinned to the node and GPU count the scheduler chose; limits from the request."""
    cpus = max(1, math.ceil(job.cpu_milli / 1000)) if job.cpu_milli else 1
    memory = job.memory_mb or settings.SLURM_DEFAULT_MEM_MB
    minutes = max(1, math.ceil(time_s / 60))
    options = [
        f"--job-name={JOB_PREFIX}{job.attempt_id}",
        f"--nodelist={slurm_node}",
        "--nodes=1", "--ntasks=1",
        f"--cpus-per-task={cpus}",
        f"--mem={memory}M",
        f"--time={minutes}",
        f"--signal=B:USR1@{min(settings.SLURM_SIGNAL_S, max(10, int(time_s) // 2))}",
        f"--output={attempt_dir / 'slurm-%j.out'}",
        f"--chdir={attempt_dir}",
        "--export=NONE",  # the batch step sees the script's variables only: no database, Redis or secrets
        "--no-requeue",  # requeueing is the portal's (a new attempt, from its checkpoint)
    ]
    if partition:
        options.append(f"--partition={partition}")
    if job.gpus >= 1:
        options.append(f"--gres=gpu:{int(job.gpus)}")
    elif job.gpus > 0:
        options.append("--gres=gpu:1")  # never placed here: Slurm nodes take whole GPUs only
    return options


def batch_script(*, python: str, code_dir: str, relay_config: Path, env: dict[str, str]) -> str:
    """The batch step: the allow-listed environment, then the relay (which runs the child)."""
    lines = ["#!/bin/bash", "# yoloportal: one attempt (generated by the slurm_agent)", "set -e"]
    for key in sorted(env):
        lines.append(f"export {key}={shlex.quote(env[key])}")
    lines += [f"cd {shlex.quote(code_dir)}",
              f"exec {shlex.quote(python)} -m worker.executors.relay {shlex.quote(str(relay_config))}", ""]
    return "\n".join(lines)


# A Slurm node found without the shared storage (its relay said so, or Slurm could not write the
# job's output file there) takes no new work this long. No process of ours runs there to say when
# the mount is back: after this the node is tried again, and a job placed there while the mount is
# still gone is requeued again (no retry spent) and takes the node out again.
SLURM_NODE_STORAGE_RETRY_S = 600.0
# A job whose Slurm attempts reported losing the shared storage this many times is not believed
# again: its next such report fails it as its own failure and leaves the node alone. The report
# comes from the compute node, where the job's own process can read the attempt's token and post
# one (or delete its Slurm output file): unbounded, one job could take node after node out and
# requeue itself for free (review22). Two real mount losses in a row are rare; a third is the job.
SLURM_STORAGE_LOST_MAX = 2
# A running attempt preempted with a grace is scancelled only this long after its grace is over:
# its relay hears "fenced" at its next report (every second) and stops the child itself (SIGTERM,
# worker.executors.base.KILL_GRACE_S, SIGKILL), reporting what it wrote meanwhile; scancel is the
# backstop for a relay that does not (an older one, or one cut off from the portal).
SLURM_STOP_MARGIN_S = 10.0
# A job Slurm still lists this long after its scancel is asked to end again (once per this long):
# well past Slurm's KillWait (30 s by default) and a slow epilog.
SLURM_SCANCEL_RESEND_S = 300.0


class SlurmAgent:
    """Runs the portal's attempts on one Slurm partition; each step returns "did work?"."""

    def __init__(self, partition: str, client: SlurmClient | None = None) -> None:
        self.partition = partition
        self.client = client or SlurmClient()
        self.last_sync = 0.0
        self.limits: dict = {}
        self.storage_problem = ""  # what the last sync found of the shared storage ('' = readable)
        # portal node name -> (what its last attempt found of the shared storage, when: monotonic):
        # see SLURM_NODE_STORAGE_RETRY_S; recalled from the job events once (node_storage_recall)
        self.node_storage: dict[str, tuple[str, float]] = {}
        self.node_storage_recalled = False
        # placement (attempt id) -> until when (monotonic) it waits for its preempted previous attempt
        self.previous_waits: dict[str, float] = {}

    # --- 1. nodes -------------------------------------------------------------------------

    def sync_nodes(self, *, force: bool = False) -> bool:
        if not force and time.monotonic() - self.last_sync < settings.SLURM_SYNC_S:
            return False
        self.last_sync = time.monotonic()
        if not self.limits:
            plugin = self.client.task_plugin()
            enforced = ["memory", "cpu"] if "task/cgroup" in plugin else []
            self.limits = {"version": "slurm", "enforced": enforced,
                           "summary": f"Slurm {plugin}: memory and CPU limits enforced by Slurm" if enforced
                           else f"limits not enforced (Slurm TaskPlugin={plugin or 'unknown'}, not task/cgroup)"}
        from worker.inventory import GpuReading

        slurm_jobs = self.client.jobs()
        problem = self.storage_check()
        for sn in self.client.nodes(self.partition):
            simulated = settings.SLURM_SIMULATED_GPUS
            gpus = [GpuReading(index=i, uuid=f"{'SIM' if simulated else 'SLURM'}-{sn.name}-{i}",
                               model=sn.gpu_model or ("Slurm GRES gpu (simulated)" if simulated else "Slurm GRES gpu"),
                               memory_mb=0, simulated=simulated) for i in range(sn.gpus)]
            node = node_register(name=node_name(sn.name), gpus=gpus, cpu_count=sn.cpus, memory_mb=sn.memory_mb,
                                 hostname=sn.name, worker_pid=None, executor=Node.Executor.SLURM,
                                 images=settings.SLURM_IMAGES or settings.NODE_IMAGES, limits=self.limits,
                                 partition=self.partition,
                                 storage_problem=problem or self.node_storage_problem(node_name(sn.name)))
            node_state_set(node, schedulable=sn.schedulable, reason=f"Slurm: {sn.state}")
            self.sync_foreign(node, sn, slurm_jobs)
        return True

    def storage_check(self) -> str:
        """What this machine finds of the shared storage now ('' = readable), said once in the log
        when it changes.

        The agent writes every attempt's configs and batch script into the job's folder, and its
        Slurm nodes read the inputs, at the shared paths. Checked at the start (slurm_agent) and
        at every node sync since: a mount that dropped later made every submit fail its job for
        good ("Slurm refused the attempt"). While it is gone the partition's nodes carry the
        problem and take no new work (as a GPU server's heartbeat does, worker.node). The Slurm
        nodes' own mounts are checked by each attempt's relay (worker/executors/relay.py) and,
        when not even the relay could start, by what Slurm left in the job's folder
        (:meth:`output_lost`); such a node is out for SLURM_NODE_STORAGE_RETRY_S.
        """
        from worker.artifacts import shared_storage_lost, shared_storage_problem

        problem = shared_storage_lost()
        if problem and not self.storage_problem:
            log.warning("partition %s takes no new work: %s", self.partition, shared_storage_problem() or problem)
        elif self.storage_problem and not problem:
            log.warning("partition %s: the shared storage is readable again", self.partition)
        self.storage_problem = problem
        return problem

    def node_storage_problem(self, name: str) -> str:
        """What the Slurm node ``name`` was last found to lack of the shared storage, while that is
        recent ('' after SLURM_NODE_STORAGE_RETRY_S: it is tried again)."""
        self.node_storage_recall()
        problem, since = self.node_storage.get(name, ("", 0.0))
        if problem and time.monotonic() - since < SLURM_NODE_STORAGE_RETRY_S:
            return problem
        self.node_storage.pop(name, None)
        return ""

    def node_storage_lost(self, node: Node, problem: str, *, job: Job) -> None:
        """The Slurm node ``node`` cannot read the shared storage (``job``'s attempt there said so, or
        its Slurm job could not write its output): no new work there for a while. Said in the job's
        events (``node_storage_lost``), which are also what an agent started meanwhile recalls."""
        if not self.node_storage_problem(node.name):
            log.warning("Slurm node %s takes no new work for %.0f s: %s (from job %s's attempt %s)", node.hostname,
                        SLURM_NODE_STORAGE_RETRY_S, problem, job.pk, job.attempt)
        self.node_storage[node.name] = (problem, time.monotonic())
        node_storage_problem_set(node, problem=problem)
        job_event(job, "node_storage_lost", f"Slurm node {node.hostname} cannot read the shared storage ({problem}): "
                                            f"it takes no new work for {SLURM_NODE_STORAGE_RETRY_S:.0f} s",
                  {"node": node.name, "storage_problem": problem})

    def node_storage_recall(self) -> None:
        """Once, at the agent's first look: the Slurm nodes of this partition another run of it took
        out (``node_storage_lost`` events) less than SLURM_NODE_STORAGE_RETRY_S ago stay out for the
        rest of that time. Before, a restarted agent put them back at its first sync, and the next
        placement there failed the same way. Counted on this machine's clocks, at most the whole
        SLURM_NODE_STORAGE_RETRY_S from now (an event written by a clock ahead of this one)."""
        if self.node_storage_recalled:
            return
        now, monotonic = timezone.now(), time.monotonic()
        ours = set(Node.objects.filter(executor=Node.Executor.SLURM, partition=self.partition)
                   .values_list("name", flat=True))
        for created_at, data in (JobEvent.objects.filter(
                kind="node_storage_lost", created_at__gte=now - timedelta(seconds=SLURM_NODE_STORAGE_RETRY_S))
                .order_by("created_at").values_list("created_at", "data")):
            name, problem = (data or {}).get("node"), (data or {}).get("storage_problem")
            if name in ours and isinstance(problem, str) and problem:
                age = min(SLURM_NODE_STORAGE_RETRY_S, max(0.0, (now - created_at).total_seconds()))
                self.node_storage[name] = (problem, monotonic - age)
        # Only once the read went through: a database blip here is tried again at the next look
        # (review24, 7), not taken as "nothing to recall".
        self.node_storage_recalled = True

    def output_lost(self, record: ExecutorAttempt, job: Job, state: str) -> str:
        """Why a Slurm job that ended without a report lost its node's mount of JOBS_DIR, or ''.

        The batch script, the relay's config and Slurm's output file all live in the job's
        folder. A Slurm node without that mount cannot open the output file, and Slurm fails the
        job at launch (FAILED, JobLaunchFailure): no relay ever runs to report. Told apart from a
        relay that crashed by what this machine sees: its own storage readable, the files it wrote
        there, and no output file, which slurmd opens before anything else runs.
        """
        if state != "FAILED" or self.storage_check():
            return ""
        attempt_dir = Path(job.run_dir) / f"attempt-{job.attempt}"
        if not (attempt_dir / "relay.json").exists() or (attempt_dir / f"slurm-{record.external_id}.out").exists():
            return ""
        return "shared storage unreachable: JOBS_DIR (Slurm could not write the job's output file there)"

    def sync_foreign(self, node: Node, sn: SlurmNode, slurm_jobs: list[SlurmJob]) -> None:
        """Jobs started outside the portal on this node hold capacity: record them."""
        taken = {i for indices in Job.objects.filter(node=node, state__in=HOLDING_STATES)
                 .values_list("gpu_indices", flat=True) for i in indices or []}
        free = [i for i in range(sn.gpus) if i not in taken][::-1]  # theirs from the top, ours from the bottom
        rows = []
        for sj in slurm_jobs:
            if sj.ours or sj.state != "RUNNING" or sn.name not in expand_nodelist(sj.nodes):
                continue
            indices, free = free[:sj.gpus], free[sj.gpus:]
            rows.append({
                "external_id": sj.job_id, "description": f"Slurm job {sj.job_id} {sj.name}"[:200],
                "gpu_indices": sorted(indices), "cpu_milli": sj.cpus * 1000, "memory_mb": sj.memory_mb,
                "started_at": _time(sj.start_time), "ends_at": _time(sj.end_time),
            })
        node_foreign_set(node, rows)

    # --- 2. start -------------------------------------------------------------------------

    def start_placed(self) -> bool:
        """Submit every attempt the scheduler placed on this partition's nodes.

        One whose cancel was asked meanwhile ends cancelled without reaching Slurm. One whose
        previous attempt was preempted and may still be finishing its epoch (its grace) waits
        here, placed, as a local worker waits before choosing its checkpoint
        (worker.tasks.AttemptRunner.previous_attempt_wait): the batch's checkpoints are chosen
        at submit (:meth:`prepare`). Skipped for this tick, not awaited: one agent starts them all.
        """
        did = False
        placed = Job.objects.filter(state=JobState.STARTING, node__executor=Node.Executor.SLURM,
                                    node__partition=self.partition).select_related("node")
        waiting: dict[str, float] = {}
        for job in placed:
            if job.cancel_requested_at:
                # Before, only a submitted attempt was cancelled (scancel at the next watch): one kept
                # waiting for its preempted attempt ignored a cancel for up to the grace (review23).
                started = attempt_start(job_id=job.pk, attempt_id=job.attempt_id, node_name=job.node.name)
                if started is not None:
                    attempt_finish(started, outcome="cancelled")
                    did = True
                continue
            silent = self.previous_attempt_waits(job, waiting)
            if silent is None:
                continue
            try:
                record = ExecutorAttempt.objects.create(job=job, attempt=job.attempt, attempt_id=job.attempt_id,
                                                        executor="slurm")
            except IntegrityError:
                continue  # already ours (or another agent's)
            started = attempt_start(job_id=job.pk, attempt_id=job.attempt_id, node_name=job.node.name)
            if started is None:
                record.delete()
                continue
            did = True
            if silent:
                previous_stop_silent_said(started, silent)
            self.submit(started, record)
        self.previous_waits = waiting  # placements gone meanwhile are forgotten
        return did

    def previous_attempt_waits(self, job: Job, waiting: dict[str, float]) -> int | None:
        """None while ``job``'s placement waits for its preempted previous attempt to stop (see
        :meth:`start_placed`); else the number of that attempt if it stopped waiting because that
        attempt stayed silent past its grace, 0 if not. The wait's end is kept per placement on this machine's monotonic clock,
        said once in the job's events when it begins."""
        from worker.tasks import PREVIOUS_STOP_MARGIN_S

        stop = attempt_previous_stop(job, margin_s=PREVIOUS_STOP_MARGIN_S)
        if stop is None:
            return 0
        key = str(job.attempt_id)
        deadline = self.previous_waits.get(key)
        if deadline is None:
            deadline = time.monotonic() + stop.left_s
            previous_stop_wait_said(job, stop, before="submitting to Slurm")
            if stop.left_s > 0:
                log.info("job %s: waiting up to %.0f s for its preempted attempt %d to stop before submitting",
                         job.pk, stop.left_s, stop.attempt)
        if time.monotonic() >= deadline:
            return stop.attempt
        waiting[key] = deadline
        return None

    def submit(self, job: Job, record: ExecutorAttempt) -> None:
        try:
            options, script = self.prepare(job)
            external_id = self.client.submit(options, script)
        except AttemptTakenAway as exc:
            log.info("job %s: not submitted: %s", job.pk, exc)
            ExecutorAttempt.objects.filter(pk=record.pk).update(finalized_at=timezone.now(), external_state="FENCED")
            attempt_finish(job, outcome="fenced")
            return
        except (SlurmError, OSError) as exc:
            log.error("sbatch for job %s failed: %s", job.pk, exc)
            ExecutorAttempt.objects.filter(pk=record.pk).update(finalized_at=timezone.now(), external_state="REFUSED")
            if isinstance(exc, OSError) and self.storage_check():
                # Writing its files failed because the shared storage is gone: not the job's fault.
                self.last_sync = 0.0  # the next tick marks the partition's nodes
                attempt_finish(job, outcome="storage_lost",
                               error=f"the slurm_agent cannot write to the shared storage ({self.storage_problem})")
                return
            attempt_finish(job, outcome="failed", error=f"Slurm refused the attempt: {exc}")
            return
        now = timezone.now()
        ExecutorAttempt.objects.filter(pk=record.pk).update(external_id=external_id, submitted_at=now,
                                                             external_state="PENDING")
        job_event(job, "slurm_submitted", f"submitted to Slurm as job {external_id} on {job.node.hostname} "
                                          f"(partition {self.partition})", {"slurm_job_id": external_id})

    def prepare(self, job: Job) -> tuple[list[str], Path]:
        """Write the child configs (newest checkpoint first, then older, then scratch), the relay's
        config with the attempt's token, and the batch script; return sbatch's options and the script."""
        from worker.tasks import child_config, child_env

        run_dir = Path(job.run_dir)
        attempt_dir = run_dir / f"attempt-{job.attempt}"
        (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        attempt_dir.mkdir(parents=True, exist_ok=True)
        stop_file = attempt_dir / "stop"
        stop_file.unlink(missing_ok=True)
        runs = []
        resumable = job.spec.get("mode", "train") == "train"  # val, predict and export start over
        # From here the attempt before this one records nothing more (jobs.services.attempt_may_record).
        if not attempt_resume_choose(job):
            # Taken away between its start and here (preempted, requeued, cancelled): a batch now would
            # train as a victim on GPUs the job no longer holds (review24, 8), as the local worker's
            # resume_candidates stops too.
            raise AttemptTakenAway(f"attempt {job.attempt} was taken away before it chose its checkpoint")
        candidates = [*(Checkpoint.objects.filter(job=job).order_by("-epoch", "-created_at") if resumable else []),
                      None]
        for number, checkpoint in enumerate(candidates, start=1):
            config = child_config(job, resume_from=checkpoint.path if checkpoint else None,
                                  events_path=attempt_dir / f"events-{number}.jsonl")
            config["stop_file"] = str(stop_file)
            path = attempt_dir / f"config-{number}.json"
            path.write_text(json.dumps(config, indent=2))
            runs.append({"config": str(path), "events": config["events_path"],
                         "epoch": checkpoint.epoch if checkpoint else None})
        python = settings.SLURM_PYTHON or sys.executable
        code_dir = settings.SLURM_CODE_DIR or str(settings.BASE_DIR)
        relay = {
            "report_url": f"{self.portal_url()}/api/v1/attempts/{job.attempt_id}/report/",
            "token": attempt_token_issue(job),
            "attempt_id": str(job.attempt_id),
            "runs": runs,
            "log": str(attempt_dir / "output.log"),
            "env": child_env(job),
            "python": python,
            "cwd": code_dir,
            "stop_file": str(stop_file),
            # What the relay looks for before and after the training (the Slurm node's mount):
            "storage_marks": storage_marks_expected() or [],
        }
        relay_path = attempt_dir / "relay.json"
        fd = os.open(relay_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it holds the token
        with os.fdopen(fd, "w") as f:
            json.dump(relay, f, indent=2)
        script = attempt_dir / "batch.sh"
        env = {k: v for k, v in child_env(job).items() if k in ("PATH", "LANG", "LC_ALL", "TZ", "HOME")}
        env["PYTHONPATH"] = code_dir
        script.write_text(batch_script(python=python, code_dir=code_dir, relay_config=relay_path, env=env))
        script.chmod(0o700)
        previous = (UsageRecord.objects.filter(job=job).aggregate(s=Sum("gpu_seconds"))["s"] or 0.0) / max(
            job.gpus, 1e-9)
        time_s = max(60.0, job.timeout_s - previous + settings.SLURM_SIGNAL_S)
        options = sbatch_options(job=job, partition=self.partition, slurm_node=job.node.hostname,
                                 attempt_dir=attempt_dir, time_s=time_s)
        return options, script

    @staticmethod
    def portal_url() -> str:
        url = settings.SLURM_PORTAL_URL or settings.PORTAL_URL
        if not url:
            raise SlurmError("SLURM_PORTAL_URL is not set: the relay on the Slurm node could not report")
        return url.rstrip("/")

    # --- 3 and 4. watch and end -----------------------------------------------------------

    def watch(self) -> bool:
        records = list(ExecutorAttempt.objects.filter(executor="slurm", finalized_at__isnull=True)
                       .exclude(external_id="").select_related("job", "job__node"))
        if not records:
            return False
        by_id = {sj.job_id: sj for sj in self.client.jobs()}
        did = False
        now = timezone.now()
        for record in records:
            did |= self.watch_one(record, by_id.get(record.external_id), now)
        return did

    def watch_one(self, record: ExecutorAttempt, sj: SlurmJob | None, now: datetime) -> bool:
        job = Job.objects.select_related("node", "team", "user").get(pk=record.job_id)
        current = str(job.attempt_id) == str(record.attempt_id) and job.state in HOLDING_STATES
        attempt = job_at(job, record)
        if sj is None:
            self.end(record, attempt, now, state="VANISHED", current=current)
            return True
        if sj.state != record.external_state or sj.reason != record.external_reason:
            updates = {"external_state": sj.state, "external_reason": sj.reason[:200]}
            if sj.state == "RUNNING" and record.running_at is None:
                updates["running_at"] = now
                if current:
                    job_event(job, "slurm_running", f"Slurm job {sj.job_id} running on {sj.nodes}",
                              {"slurm_job_id": sj.job_id})
            ExecutorAttempt.objects.filter(pk=record.pk).update(**updates)
            record.external_state, record.external_reason = sj.state, sj.reason
        if sj.state in ENDED_STATES:
            self.end(record, attempt, now, state=sj.state, current=current, exit_code=sj.exit_code)
            return True
        if not current:
            stop_by = attempt_stop_by(attempt) if sj.state == "RUNNING" else None
            if stop_by is not None and now < stop_by + timedelta(seconds=SLURM_STOP_MARGIN_S):
                return False  # preempted with a grace: its relay stops the training at its epoch end
            # fenced: requeued, preempted, reaped
            return self.cancel(record, why="its attempt is no longer current", now=now)
        if job.cancel_requested_at:
            return self.cancel(record, why="cancel requested", now=now)
        if sj.state == "PENDING" and record.submitted_at and \
                (now - record.submitted_at).total_seconds() > settings.SLURM_PENDING_LIMIT_S:
            self.withdraw(record, job, sj, now)
            return True
        attempt_heartbeat(job)  # pending or running in Slurm: alive (the relay also reports)
        return False

    def cancel(self, record: ExecutorAttempt, *, why: str, now: datetime) -> bool:
        """Ask Slurm to end the attempt's job (scancel); whether this call asked.

        Asked once: Slurm's reason, which the next look writes into ``external_reason``, does not
        make it ask again (it did at every poll until the job ended). Asked again only when the
        command failed (nothing is recorded, the next look retries) or when Slurm still lists the
        job :data:`SLURM_SCANCEL_RESEND_S` after (a scancel lost with its controller, say)."""
        if record.scancel_sent_at is not None and (
                now - record.scancel_sent_at).total_seconds() < SLURM_SCANCEL_RESEND_S:
            return False  # asked already; wait for Slurm to end it
        try:
            self.client.cancel(record.external_id)
        except SlurmError as exc:
            log.warning("scancel %s failed: %s", record.external_id, exc)
            return False
        again = record.scancel_sent_at is not None
        ExecutorAttempt.objects.filter(pk=record.pk).update(scancel_sent_at=now, scancel_reason=why[:200])
        record.scancel_sent_at, record.scancel_reason = now, why[:200]
        (log.warning if again else log.info)("scancel %s (%s)%s", record.external_id, why,
                                             ": still listed by Slurm since the last one" if again else "")
        return True

    def withdraw(self, record: ExecutorAttempt, job: Job, sj: SlurmJob, now: datetime) -> None:
        """Pending in Slurm past the limit: take it back and let the portal place it again."""
        self.cancel(record, why="pending past SLURM_PENDING_LIMIT_S", now=now)
        waited = (now - record.submitted_at).total_seconds()
        usage_charge(job, ended_at=now)
        job_requeue(job, kind="slurm_withdrawn", reason=(
            f"Slurm job {sj.job_id} was still pending after {waited:.0f} s (Slurm's reason: {sj.reason or 'none'}); "
            f"withdrawn and requeued as attempt {job.attempt + 1} (not counted as a retry)"))
        kick_scheduler()

    def end(self, record: ExecutorAttempt, job: Job, now: datetime, *, state: str, current: bool,
            exit_code: int | None = None) -> None:
        """Slurm says the job ended: decide the attempt's outcome (once)."""
        if not ExecutorAttempt.objects.filter(pk=record.pk, finalized_at__isnull=True).update(
                finalized_at=now, ended_at=now, external_state=state):
            return
        record.refresh_from_db()
        try:
            self.outcome(record, job, now, state=state, current=current, exit_code=exit_code)
        except Exception as exc:  # noqa: BLE001 - the record is finalized: nothing would look at it again
            # A report the agent cannot read (the job's own process can post one) must still end the
            # attempt: else the job stayed running, unwatched, until the reaper took it as a lost node.
            log.exception("Slurm job %s (job %s): cannot decide the attempt's outcome", record.external_id, job.pk)
            if Job.objects.filter(pk=job.pk, attempt_id=job.attempt_id, state__in=HOLDING_STATES).exists():
                attempt_finish(job, outcome="failed", exit_code=exit_code,
                               error=f"Slurm job {record.external_id} ended {state}; its relay's final report could "
                                     f"not be read ({type(exc).__name__}): see the job's log")
        kick_scheduler()

    def storage_lost(self, job: Job, problem: str, *, exit_code: int | None, error: str,
                     report: dict | None = None) -> None:
        """End the attempt whose compute node lost the shared storage (its report, or Slurm could not
        write its output there): requeued, the node out for a while. Not believed past
        :data:`SLURM_STORAGE_LOST_MAX` such requeues of started attempts of the job (see there; a
        placement handed back before it started is no attempt's claim).

        A training that *succeeded* as the mount went (its report's ``finished``) is requeued too
        (worker.executors.relay); when that is not believed, or the job has no requeue left that is
        not a retry, it is the success the training reported, not a failure (review23)."""
        believed = JobEvent.objects.filter(job_id=job.pk, kind="storage_unavailable",
                                           data__attempt_started=True).count() < SLURM_STORAGE_LOST_MAX
        if report and report.get("exit_code") == 0 and report.get("finished") and not (
                believed and infra_requeues_left(job)):
            finish_from_report(job, {**report, "outcome": "succeeded", "error": None})
            return
        if not believed:
            attempt_finish(job, outcome="failed", exit_code=exit_code,
                           error=f"{error}; after {SLURM_STORAGE_LOST_MAX} earlier such requeues of this job this is "
                                 f"not believed again (SLURM_STORAGE_LOST_MAX): counted as the job's own failure, and "
                                 f"the node left in service")
            return
        self.node_storage_lost(job.node, problem, job=job)
        attempt_finish(job, outcome="storage_lost", exit_code=exit_code, error=error)

    def outcome(self, record: ExecutorAttempt, job: Job, now: datetime, *, state: str, current: bool,
                exit_code: int | None) -> None:
        report = record.report or {}
        external = f"Slurm job {record.external_id}"
        if not current:
            attempt_finish(job, outcome="fenced")
        elif state in REQUEUE_STATES or state == "VANISHED":
            reason = (f"{external} ended {state} on {job.node.hostname}" if state != "VANISHED"
                      else f"{external} is no longer known to Slurm")
            attempt_lost(job, reason=reason, now=now)
        elif job.cancel_requested_at and state in ("CANCELLED", "FAILED", "COMPLETED") and not report.get(
                "outcome") == "succeeded":
            attempt_finish(job, outcome="cancelled", exit_code=report.get("exit_code"))
        elif state == "TIMEOUT":
            attempt_finish(job, outcome="timed_out", exit_code=report.get("exit_code"))
        elif state == "OUT_OF_MEMORY":
            limit = (job.memory_mb or settings.SLURM_DEFAULT_MEM_MB) * 2**20
            attempt_finish(job, outcome="out_of_memory", exit_code=report.get("exit_code"),
                           error=oom_message(Usage(memory_peak_bytes=limit, memory_limit_bytes=limit, oom_kills=1)))
        elif report.get("outcome") == "storage_lost":
            problem = reported_storage_problem(report)
            self.storage_lost(job, problem, exit_code=report.get("exit_code"), report=report,
                              error=f"Slurm node {job.node.hostname} lost the shared storage while the attempt ran: "
                                    f"{problem}")
        elif report.get("outcome"):
            finish_from_report(job, report)
        elif state == "CANCELLED":
            attempt_finish(job, outcome="killed", exit_code=-15)  # scancelled outside the portal
        elif problem := self.output_lost(record, job, state):
            self.storage_lost(job, problem, exit_code=exit_code,
                              error=f"{external} ended {state} on {job.node.hostname}, which lost the shared "
                                    f"storage: {problem}")
        else:
            attempt_finish(job, outcome="failed", exit_code=exit_code,
                           error=f"{external} ended {state} (exit code {exit_code}) without a report from its "
                                 f"relay; see the job's log and {Path(job.run_dir).name}/attempt-{job.attempt}/"
                                 f"slurm-{record.external_id}.out")

    def tick(self) -> bool:
        close_old_connections()
        did = False
        for step in (self.sync_nodes, self.start_placed, self.watch):
            try:
                did |= bool(step())
            except SlurmError as exc:
                log.warning("%s: %s", step.__name__, exc)
        return did


def job_at(job: Job, record: ExecutorAttempt) -> Job:
    """``job`` as it was during ``record``'s attempt (its number and id), for fenced reporting."""
    if str(job.attempt_id) == str(record.attempt_id):
        return job
    stale = Job.objects.select_related("node", "team", "user").get(pk=job.pk)
    stale.attempt, stale.attempt_id = record.attempt, record.attempt_id
    return stale


def reported_storage_problem(report: dict) -> str:
    """The node's ``storage_problem`` from a relay's ``storage_lost`` report, built from the roots
    and words we know only: every user sees it, and a job's own process could post the report
    (the token is in its folder), so no text of the report goes there as it came."""
    known = {"no storage marker", "another installation's storage marker", "unreadable"}
    said = []
    error = report.get("error")
    roots = error.get("roots") if isinstance(error, dict) else None
    for item in (roots if isinstance(roots, list) else [])[:len(ROOTS)]:
        setting, what = (item if isinstance(item, list) and len(item) == 2 else ["", ""])
        if isinstance(setting, str) and setting in ROOTS.values():
            said.append(f"{setting} ({what if isinstance(what, str) and what in known else 'unreadable'})")
    return f"shared storage unreachable: {', '.join(said) or 'a shared root'}"


def finish_from_report(job: Job, report: dict) -> str:
    """The relay's final report → the attempt's outcome, exactly as a local attempt's."""
    error = report.get("error") or {}
    outcome = report["outcome"]
    if outcome == "checkpoint_unusable":
        outcome = "failed"  # every candidate was tried by the relay
    parts = []
    if error:
        parts.extend(error_lines(error, job.spec.get("mode") or "train"))
    elif outcome == "killed":
        parts.append(f"training process was killed by signal {-(report.get('exit_code') or 0)}")
    elif outcome != "succeeded":
        parts.append(f"training process exited with code {report.get('exit_code')}")
    tail = traceback_strip(report.get("log_tail") or [])
    if tail:
        parts.append("Last log lines:\n" + "\n".join(tail[-20:]))
    cuda = error.get("kind") == "oom" and error.get("cuda")
    return attempt_finish(job, outcome=outcome, exit_code=report.get("exit_code"), error="\n".join(parts)[:20000],
                          finished=report.get("finished"),
                          cuda_oom_batch=(error.get("batch") or report.get("batch")) if cuda else None)


def expand_nodelist(text: str) -> set[str]:
    """``vm``, ``gpu[01-03,07]`` → the node names (what squeue prints in ``nodes``)."""
    names: set[str] = set()
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?", text or ""):
        match = re.fullmatch(r"(.*)\[(.*)\]", part)
        if not match:
            names.add(part)
            continue
        prefix, ranges = match.groups()
        for piece in ranges.split(","):
            lo, _, hi = piece.partition("-")
            for number in range(int(lo), int(hi or lo) + 1):
                names.add(f"{prefix}{number:0{len(lo)}d}")
    return names


def _time(epoch_s: float) -> datetime | None:
    return datetime.fromtimestamp(epoch_s, tz=UTC) if epoch_s and epoch_s > 0 else None


__all__ = ["SlurmAgent", "SlurmClient", "SlurmError", "parse_nodes", "parse_jobs", "sbatch_options",
           "batch_script", "expand_nodelist"]
