"""Replay an openb-format GPU trace through the scheduling policy with simulated time.

Pure Python, no Django: ``manage.py simulate`` is a thin wrapper around
:func:`run_simulation`. The simulator calls the very same ``policy.plan()`` the live
scheduler calls, only on events (arrivals, completions, quota wake-ups), with all
events at the same instant handled in one pass.

Trace treatment (documented in docs/scheduling.md):

- Duration = ``deletion_time - scheduled_time``. Tasks never scheduled in the real
  cluster (empty ``scheduled_time``) have no runtime and are skipped; so are CPU-only
  tasks (``num_gpu == 0``): the portal schedules GPU jobs. Both are counted in the output.
- ``num_gpu >= 2`` asks for that many whole GPUs; ``num_gpu == 1`` asks for
  ``gpu_milli / 1000`` of one GPU (fractional below 1000). ``gpu_spec`` ('|'-separated
  models) becomes ``gpu_models``; ``cpu_milli``/``memory_mib`` are per-node CPU/RAM.
- Users and teams: ``users`` users spread over ``teams`` teams round-robin; each task
  is drawn a user with probability ∝ 1 / rank^``zipf_s`` (seeded), so a few heavy users
  submit most of the work.
- ``qos`` → class: ``Guaranteed`` → urgent, ``LS`` (latency-sensitive) → high,
  ``Burstable`` → medium, ``BE`` (best-effort) and anything else → low. Low and medium
  jobs are preemptible (they checkpoint every ``checkpoint_s``; a preempted job loses
  the work since its last checkpoint and is requeued with its original submit time).
- Walltime estimate = true duration × lognormal(0, ``walltime_sigma``) (seeded): the
  planner never sees the true duration; jobs always run for their true duration.
- A task that can never fit the simulated cluster (e.g. its ``gpu_spec`` excludes the
  cluster's model, or it asks for more CPU than a node has) is rejected at submit, like
  the live system does, and counted under ``rejected``.
- ``load``: arrival times are scaled so that offered load = Σ(GPUs × duration) /
  (cluster GPUs × arrival span) equals ``load``; durations are unchanged.
"""

from __future__ import annotations

import bisect
import csv
import heapq
import math
import random
import re
import statistics
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial

from .policy import (
    DAY_S,
    Allocation,
    ClusterState,
    DecayedUsage,
    GpuInfo,
    JobRequest,
    NodeInfo,
    Plan,
    PolicyConfig,
    RollingUsage,
    admission_error,
    plan,
)
from .policy.eta_calibration import HISTORY_MAX_WAIT_S, HISTORY_N, HISTORY_S
from .policy.placement import NodeCapacity

QOS_CLASS = {"Guaranteed": "urgent", "LS": "high", "Burstable": "medium", "BE": "low"}
# Shape of one GPU in an ``NxG`` cluster. Model G2 (the trace's most common 8-GPU node);
# CPU and RAM per GPU of the trace's G3 8-GPU nodes (128 cores, 768 GiB), because the
# trace's tasks ask for ~11.4 cores per GPU on average: on G2's 12 cores per GPU a small
# cluster runs out of CPU before GPUs, and this study is about GPUs.
NXG_MODEL = "G2"
NXG_GPU_MEMORY_MB = 0  # the openb trace has no GPU-memory requests
NXG_CPU_MILLI_PER_GPU = 16000
NXG_MEMORY_MB_PER_GPU = 98304
BOUNDED_SLOWDOWN_S = 10.0
EPS_GPU = 1e-9


@dataclass(frozen=True)
class TraceTask:
    name: str
    submit: float
    duration: float
    gpus: float
    gpu_models: tuple[str, ...]
    cpu_milli: int
    memory_mb: int
    qos: str


def load_trace(path: str) -> tuple[list[TraceTask], dict[str, int]]:
    """GPU tasks of an openb pod list, and how many rows were skipped and why."""
    tasks: list[TraceTask] = []
    skipped = {"never_scheduled": 0, "cpu_only": 0}
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            num_gpu = int(row["num_gpu"] or 0)
            if num_gpu == 0:
                skipped["cpu_only"] += 1
                continue
            if not row.get("scheduled_time"):
                skipped["never_scheduled"] += 1
                continue
            milli = int(row.get("gpu_milli") or 1000)
            gpus = float(num_gpu) if num_gpu >= 2 else min(1000, max(1, milli)) / 1000.0
            models = tuple(sorted({m for m in (row.get("gpu_spec") or "").split("|") if m}))
            tasks.append(
                TraceTask(
                    name=row["name"],
                    submit=float(row["creation_time"]),
                    duration=max(0.0, float(row["deletion_time"]) - float(row["scheduled_time"])),
                    gpus=gpus,
                    gpu_models=models,
                    cpu_milli=int(float(row.get("cpu_milli") or 0)),
                    memory_mb=int(float(row.get("memory_mib") or 0)),
                    qos=row.get("qos") or "",
                )
            )
    tasks.sort(key=lambda t: (t.submit, t.name))
    return tasks, skipped


def load_nodes(spec: str) -> tuple[NodeInfo, ...]:
    """The simulated cluster, from one of three specs.

    - ``NxG``: N nodes of G GPUs of model G2 (see ``NXG_*``).
    - ``PATH.csv``: every GPU node of an openb node list (sn, cpu_milli, memory_mib, gpu, model).
    - ``PATH.csv@N:SEED``: a mixed cluster of N nodes drawn from that list with ``SEED``:
      one node of every GPU model first, then nodes drawn at random from the whole list,
      taking care that nodes of 1, 2, 4 and 8 GPUs all occur (:func:`sample_nodes`).
    """
    match = re.fullmatch(r"(\d+)x(\d+)", spec.strip())
    if match:
        n, g = int(match.group(1)), int(match.group(2))
        return tuple(
            NodeInfo(
                name=f"node-{i:03d}",
                gpus=tuple(GpuInfo(j, NXG_MODEL, NXG_GPU_MEMORY_MB) for j in range(g)),
                cpu_milli=NXG_CPU_MILLI_PER_GPU * g,
                memory_mb=NXG_MEMORY_MB_PER_GPU * g,
            )
            for i in range(n)
        )
    path, _, sample = spec.partition("@")
    nodes = []
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            g = int(row["gpu"] or 0)
            if g <= 0:
                continue
            nodes.append(
                NodeInfo(
                    name=row["sn"],
                    gpus=tuple(GpuInfo(j, row.get("model") or "", 0) for j in range(g)),
                    cpu_milli=int(float(row.get("cpu_milli") or 0)),
                    memory_mb=int(float(row.get("memory_mib") or 0)),
                )
            )
    if sample:
        count, _, seed = sample.partition(":")
        return sample_nodes(nodes, int(count), int(seed or 0))
    return tuple(nodes)


def sample_nodes(nodes: Sequence[NodeInfo], count: int, seed: int) -> tuple[NodeInfo, ...]:
    """A seeded mixed cluster of ``count`` nodes: every GPU model, nodes of 1, 2, 4 and 8 GPUs."""
    rng = random.Random(seed)
    by_model: dict[str, list[NodeInfo]] = {}
    for n in nodes:
        by_model.setdefault(n.gpus[0].model, []).append(n)
    chosen: dict[str, NodeInfo] = {}
    for model in sorted(by_model):
        if len(chosen) < count:
            pick = rng.choice(by_model[model])
            chosen[pick.name] = pick
    sizes = sorted({len(n.gpus) for n in nodes} & {1, 2, 4, 8})
    while len(chosen) < count:
        missing = [g for g in sizes if all(len(n.gpus) != g for n in chosen.values())]
        pool = [n for n in nodes if len(n.gpus) == missing[0]] if missing else nodes
        pick = rng.choice(pool)
        chosen.setdefault(pick.name, pick)
    return tuple(sorted(chosen.values(), key=lambda n: n.name))


def assign_users(n_tasks: int, seed: int, users: int, teams: int, zipf_s: float) -> list[tuple[str, str]]:
    """(team, user) per task: Zipf-skewed users, users spread over teams round-robin."""
    rng = random.Random(seed)
    names = [(f"team-{i % teams:02d}", f"user-{i:03d}") for i in range(users)]
    weights = [1.0 / (rank + 1) ** zipf_s for rank in range(users)]
    return rng.choices(names, weights=weights, k=n_tasks)


def offered_load(tasks: Sequence[TraceTask], total_gpus: float) -> float:
    span = tasks[-1].submit - tasks[0].submit if len(tasks) > 1 else 0.0
    work = sum(t.gpus * t.duration for t in tasks)
    return work / (total_gpus * span) if span > 0 else math.inf


def rescale(tasks: Sequence[TraceTask], total_gpus: float, load: float) -> list[TraceTask]:
    factor = offered_load(tasks, total_gpus) / load
    t0 = tasks[0].submit
    return [replace(t, submit=t0 + (t.submit - t0) * factor) for t in tasks]


def srpt_lower_bound(tasks: Sequence[TraceTask], total_gpus: float) -> float:
    """Mean JCT of preemptive SRPT on one machine of speed ``total_gpus`` (job size = GPU-seconds).

    SRPT is optimal for mean flow time on one machine, and any schedule on the real
    cluster can be run on the pooled machine at least as fast, so this bounds every policy.
    """
    order = sorted(tasks, key=lambda t: t.submit)
    heap: list[tuple[float, int]] = []  # remaining GPU-seconds, task index
    flow = 0.0
    now = order[0].submit if order else 0.0
    i = 0
    n = len(order)
    while i < n or heap:
        if not heap:
            now = max(now, order[i].submit)
        next_arrival = order[i].submit if i < n else math.inf
        if heap:
            rem, idx = heap[0]
            finish = now + rem / total_gpus
            if finish <= next_arrival:
                heapq.heappop(heap)
                now = finish
                flow += now - order[idx].submit
                continue
            heapq.heapreplace(heap, (rem - (next_arrival - now) * total_gpus, idx))
            now = next_arrival
        while i < n and order[i].submit <= now:
            heapq.heappush(heap, (order[i].gpus * order[i].duration, i))
            i += 1
    return flow / n if n else 0.0


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    k = (len(sorted_values) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def jain(values: Iterable[float]) -> float:
    xs = list(values)
    if not xs:
        return 1.0
    s = sum(xs)
    sq = sum(x * x for x in xs)
    return (s * s) / (len(xs) * sq) if sq > 0 else 1.0


@dataclass(frozen=True)
class JobModel:
    """How simulated jobs behave around preemption (the parameters the policy cannot change).

    - ``checkpoint_s``: the longest epoch; each job checkpoints at every epoch end, an
      epoch being a tenth of its duration, at least 30 s and at most ``checkpoint_s``.
    - ``restart_s``: a resumed attempt makes no progress for this long (reload, warm-up).
    - ``graceful``: a victim stops at its next epoch end if that comes within the
      preemption's ``grace_s`` (losing nothing), else it is killed then and loses the work
      since its last checkpoint. ``False``: killed at once.
    - ``preemptible``: fraction of jobs whose spec allows preemption (seeded draw).
    - ``unestimated``: fraction of jobs with no runtime estimate (``walltime_s=None``).
    """

    checkpoint_s: float = 600.0
    restart_s: float = 120.0
    graceful: bool = True
    preemptible: float = 1.0
    unestimated: float = 0.0

    def epoch_s(self, duration: float) -> float:
        return min(self.checkpoint_s, max(30.0, duration / 10.0))


@dataclass
class _Job:
    task: TraceTask
    request: JobRequest
    remaining: float  # true seconds of work left at the start of the current attempt
    epoch_s: float = 600.0
    done_before: float = 0.0  # work kept from earlier attempts (a checkpoint boundary)
    attempt: int = 0
    run_from: float = 0.0  # when the current attempt starts making progress
    first_start: float | None = None
    finish: float | None = None
    eta_at_submit: float | None = None
    eta_model_at_submit: float | None = None  # the model's point before calibration (the ETA track record)
    eta_low: float | None = None
    eta_high: float | None = None
    eta_position: int | None = None  # its queue position when its ETA was given (bench/eta_calibration.py)
    preempted: int = 0
    lost_s: float = 0.0  # seconds of progress lost to kills, plus restart overhead
    spec_preemptible: bool = True
    active_users: int = 1  # users with queued or running work when it was submitted (incl. its own)

    def progress(self, t: float) -> float:
        return self.done_before + max(0.0, t - self.run_from)


class IdleWhileWaiting:
    """Which idle GPUs a waiting job could have used, between two events (work conservation).

    The rule, per node, after each planning pass (the state then holds until the next event):

    1. Free GPU capacity F = what running allocations leave (a shared GPU counts its free
       fraction): the simulator's own view, as in ``utilization`` (a victim still stopping
       no longer counts; the job started in its place does).
    2. If some waiting job (queued, or requeued after a preemption) fits the node's free
       capacity now — its GPU count, or its fraction of one GPU, on GPUs of a model it
       allows, and its CPU and RAM, as ``NodeCapacity.fit`` decides — then min(F, R) of the
       free GPUs are *held for a reservation*, R = GPUs the pass's reservations hold on that
       node (the policy keeps them free on purpose), and F − min(F, R) are *idle while a
       job waits* (the work-conservation figure).
    3. Else, if some waiting job's GPU request fits there but not its CPU or RAM, all F
       are *short of CPU or RAM*.
    4. Else no waiting job can use them now: min(F, R) are *kept for a reservation* (the
       node drains for a job too wide for it yet; nothing could backfill), and the rest
       count in none of these (no waiting job's GPU request fits them).

    Limits: one small waiting job makes all of a node's free GPUs count (an upper bound:
    it would use only its own); the same job may count on several nodes; a job that would
    fit only in two nodes' free GPUs together counts nowhere (a job never spans nodes).
    Cheap: a node is looked at again only when its allocations or the waiting shapes
    changed, and waiting jobs are grouped by everything but CPU and RAM, so a group costs
    one ``fit`` and a walk of its (CPU, RAM) pairs in CPU order.
    """

    def __init__(self, nodes: Sequence[NodeInfo]) -> None:
        self.caps = {n.name: NodeCapacity.of(n, ()) for n in nodes if n.schedulable}
        self.count: dict[tuple, int] = {}  # waiting shape -> waiting jobs of it
        # (GPUs, models, GPU memory, image, features) -> (a probe without CPU or RAM, sorted (CPU, RAM))
        self.groups: dict[tuple, tuple[JobRequest, list[tuple[int, int]]]] = {}
        self.added: list[tuple] = []  # shapes in the order they (re)appeared among the waiting
        self.version = dict.fromkeys(self.caps, 0)
        # node -> (its version when looked at, len(added) then, a shape that fits, a group whose GPUs fit)
        self.seen: dict[str, tuple[int, int, tuple | None, tuple | None]] = {}

    def take(self, alloc: Allocation, sign: int = 1) -> None:
        cap = self.caps.get(alloc.node)
        if cap is not None:
            cap.take(alloc.gpu_indices, alloc.gpu_share, alloc.gpu_memory_mb, alloc.cpu_milli, alloc.memory_mb, sign)
            self.version[alloc.node] += 1

    def wait(self, request: JobRequest) -> None:
        shape = request.shape
        n = self.count.get(shape, 0)
        self.count[shape] = n + 1
        if n == 0:
            key = shape[:3] + shape[5:]
            group = self.groups.get(key)
            if group is None:
                probe = replace(request, job_id="", cpu_milli=0, memory_mb=0, walltime_s=None, attained_s=0.0)
                group = self.groups[key] = (probe, [])
            bisect.insort(group[1], (shape[3], shape[4]))
            self.added.append(shape)

    def unwait(self, request: JobRequest) -> None:
        shape = request.shape
        n = self.count[shape] - 1
        if n:
            self.count[shape] = n
            return
        del self.count[shape]
        pairs = self.groups[shape[:3] + shape[5:]][1]
        del pairs[bisect.bisect_left(pairs, (shape[3], shape[4]))]

    def _look(self, cap: NodeCapacity, shapes: Iterable[tuple] | None) -> tuple[tuple | None, tuple | None]:
        """(a waiting shape that fits ``cap``, a group whose GPU request fits it), each or None.

        ``shapes``: look only at these (shapes that came since the node was last looked at);
        None: at every waiting shape.
        """
        node = cap.node
        cpu_free = cap.cpu_free if node.cpu_milli else math.inf
        mem_free = cap.mem_free if node.memory_mb else math.inf
        gpu_fit = None
        if shapes is None:
            items = [(key, pairs) for key, (_, pairs) in self.groups.items() if pairs]
        else:
            items = [(s[:3] + s[5:], ((s[3], s[4]),)) for s in shapes if s in self.count]
        for key, pairs in items:
            if cap.fit(self.groups[key][0]) is None:
                continue
            gpu_fit = gpu_fit or key
            for cpu, mem in pairs:
                if cpu > cpu_free:
                    break
                if mem <= mem_free:
                    return key[:3] + (cpu, mem) + key[3:], key
        return None, gpu_fit

    def rates(self, reserved: Callable[[], dict[str, float]]) -> tuple[float, float, float, float]:
        """GPUs (idle while a job waits, held for a reservation, short of CPU or RAM, kept for a
        reservation) until the next event.

        ``reserved`` gives the GPUs the pass's reservations hold per node; called only if needed.
        """
        blocked = held = short = kept_only = 0.0
        need: dict[str, float] | None = None
        for name, cap in self.caps.items():
            if not self.count:
                break
            free = 0.0
            for f in cap.gpu_free.values():
                if f > EPS_GPU:
                    free += f
            if free <= EPS_GPU:
                continue
            version = self.version[name]
            seen = self.seen.get(name)
            if seen is None or seen[0] != version or (seen[2] is not None and seen[2] not in self.count):
                fits, gpu_fit = self._look(cap, None)
            elif seen[2] is not None:
                fits, gpu_fit = seen[2], seen[3]
            else:  # nothing fitted, the node is unchanged: only shapes that came since can fit
                fits, gpu_fit = self._look(cap, self.added[seen[1] :])
                old = seen[3]
                if gpu_fit is None and old is not None and self.groups[old][1]:
                    gpu_fit = old
                elif gpu_fit is None and old is not None:
                    fits, gpu_fit = self._look(cap, None)
            self.seen[name] = (version, len(self.added), fits, gpu_fit)
            if fits is None and gpu_fit is not None:
                short += free
                continue
            if need is None:
                need = reserved()
            kept = min(free, need.get(name, 0.0))
            if fits is None:
                kept_only += kept
                continue
            held += kept
            blocked += free - kept
        return blocked, held, short, kept_only


def simulate_policy(
    tasks: Sequence[TraceTask],
    owners: Sequence[tuple[str, str]],
    nodes: tuple[NodeInfo, ...],
    config: PolicyConfig,
    *,
    seed: int = 0,
    walltime_sigma: float = 0.5,
    model: JobModel | None = None,
    checkpoint_s: float | None = None,
    timeline_points: int = 400,
) -> dict:
    """Replay ``tasks`` through ``plan()`` under ``config``; metrics as a dict.

    1. Every task gets a walltime estimate (true duration × lognormal noise), a spec
       preemptibility and maybe no estimate at all (``model``), all seeded.
    2. Events in time order: arrivals, completions, victims that finished stopping, quota
       wake-ups; all events at one instant are handled, then ``plan()`` runs once.
    3. Starts become allocations; a started job makes progress from its start (plus the
       victims' stop time and its own restart overhead); preemptions stop the victim
       gracefully or kill it (``JobModel``) and requeue it with the progress it keeps.
    """
    model = model or JobModel()
    if checkpoint_s is not None:
        model = replace(model, checkpoint_s=checkpoint_s)
    rng = random.Random(seed + 7919)  # walltime noise (the same draws as before JobModel existed)
    spec_rng = random.Random(seed + 104729)  # preemptibility and missing estimates
    total_gpus = float(sum(len(n.gpus) for n in nodes if n.schedulable))
    jobs: dict[str, _Job] = {}
    arrivals: list[_Job] = []
    rejected = 0
    for task, (team, user) in zip(tasks, owners, strict=True):
        noise = math.exp(rng.gauss(0.0, walltime_sigma)) if walltime_sigma > 0 else 1.0
        spec_preemptible = spec_rng.random() < model.preemptible
        estimated = spec_rng.random() >= model.unestimated
        request = JobRequest(
            job_id=task.name,
            team=team,
            user=user,
            submitted_at=task.submit,
            gpus=task.gpus,
            priority_class=QOS_CLASS.get(task.qos, "low"),
            gpu_models=task.gpu_models,
            cpu_milli=task.cpu_milli,
            memory_mb=task.memory_mb,
            timeout_s=365 * 86400.0,
            walltime_s=max(60.0, task.duration * noise) if estimated else None,
            preemptible=spec_preemptible,
        )
        if admission_error(nodes, request, config) is not None:
            rejected += 1
            continue
        job = _Job(task, request, task.duration, model.epoch_s(task.duration), spec_preemptible=spec_preemptible)
        jobs[task.name] = job
        arrivals.append(job)

    usage = DecayedUsage(config.half_life_s)
    rolling = RollingUsage() if config.user_gpu_hours_per_day is not None else None
    urgent_rolling = RollingUsage()
    running: dict[str, Allocation] = {}
    queued: dict[str, JobRequest] = {}
    stopping: dict[str, tuple[float, float]] = {}  # victim -> (stop time, progress kept)
    completions: list[tuple[float, str, int]] = []  # (time, job id, attempt)
    requeues: list[tuple[float, str]] = []  # (stop time, job id)
    # GPUs a victim still holds while it stops (until its epoch end, at most the grace): a job
    # started on one of them makes no progress before then, as live, where the node's GPU
    # locks hold its attempt. Keyed (node, GPU index); a shared GPU is held whole.
    held_until: dict[tuple[str, int], float] = {}
    wakeups: list[float] = []
    recent: deque[JobRequest] = deque()  # arrivals in the last inflow window (the ETA model's inflow)
    # The ETA track record (policy/eta_calibration.py): (first start, predicted wait, actual wait)
    # of jobs that waited, appended when they first start — the past only, as live.
    eta_history: deque[tuple[float, float, float]] = deque(maxlen=HISTORY_N)
    active_by_user: dict[str, int] = {}
    preemptions = 0
    busy_gpus = 0.0
    busy_area = 0.0
    busy_area_all = 0.0
    idle_while_waiting = IdleWhileWaiting(nodes)
    # Free GPUs until the next event: idle while a job waits, held for a reservation, short of
    # CPU or RAM, kept for a reservation no waiting job could backfill (IdleWhileWaiting.rates()
    # of the last pass), and idle with no job waiting at all; their GPU-seconds over the arrival
    # window and over the whole replay.
    idle_rates = (0.0, 0.0, 0.0, 0.0, 0.0)
    idle_area = [0.0, 0.0, 0.0, 0.0, 0.0]
    idle_area_all = [0.0, 0.0, 0.0, 0.0, 0.0]
    window = (arrivals[0].task.submit, arrivals[-1].task.submit) if arrivals else (0.0, 0.0)
    last_t = window[0]
    queue_samples: list[tuple[float, int]] = []
    quota_s = config.user_gpu_hours_per_day * 3600.0 if config.user_gpu_hours_per_day is not None else None
    over_quota_excess = 0.0
    i = 0
    passes = 0

    def charge(until: float) -> None:
        nonlocal last_t, busy_area, busy_area_all
        dt = until - last_t
        if dt <= 0:
            return
        lo, hi = max(last_t, window[0]), min(until, window[1])
        if hi > lo:
            busy_area += busy_gpus * (hi - lo)
            for k, rate in enumerate(idle_rates):
                idle_area[k] += rate * (hi - lo)
        busy_area_all += busy_gpus * dt
        for k, rate in enumerate(idle_rates):
            idle_area_all[k] += rate * dt
        for alloc in running.values():
            used = alloc.gpus * dt
            rate = 1.0 if jobs[alloc.job_id].spec_preemptible else config.nonpreemptible_charge
            usage.add((alloc.team, alloc.user), used * rate, until)
            if rolling is not None:
                rolling.add(alloc.user, used, until)
            if alloc.priority_class == "urgent":
                urgent_rolling.add(alloc.team, used, until)
        last_t = until

    def leave(job: _Job) -> None:
        user = job.request.user
        active_by_user[user] -= 1
        if not active_by_user[user]:
            del active_by_user[user]

    def finish(job: _Job, t: float) -> None:
        job.finish = t
        job.remaining = 0.0
        leave(job)

    while i < len(arrivals) or completions or requeues or (wakeups and queued):
        t = math.inf
        if i < len(arrivals):
            t = arrivals[i].task.submit
        if completions:
            t = min(t, completions[0][0])
        if requeues:
            t = min(t, requeues[0][0])
        if wakeups and queued:
            t = min(t, wakeups[0])
        if t == math.inf:
            break
        charge(t)
        new_ids: list[str] = []
        while i < len(arrivals) and arrivals[i].task.submit <= t:
            job = arrivals[i]
            queued[job.request.job_id] = job.request
            idle_while_waiting.wait(job.request)
            new_ids.append(job.request.job_id)
            recent.append(job.request)
            user = job.request.user
            active_by_user[user] = active_by_user.get(user, 0) + 1
            job.active_users = len(active_by_user)
            i += 1
        while recent and recent[0].submitted_at < t - DAY_S:
            recent.popleft()
        while eta_history and eta_history[0][0] < t - HISTORY_S:
            eta_history.popleft()
        while completions and completions[0][0] <= t:
            _, job_id, attempt = heapq.heappop(completions)
            job = jobs[job_id]
            if attempt != job.attempt or job.finish is not None:
                continue  # a stale completion of a preempted attempt
            if job_id in running:
                alloc = running.pop(job_id)
                busy_gpus -= alloc.gpus
                idle_while_waiting.take(alloc, -1)
                finish(job, t)
            elif job_id in stopping:  # it reached its end before its next epoch end
                del stopping[job_id]
                finish(job, t)
        while requeues and requeues[0][0] <= t:
            _, job_id = heapq.heappop(requeues)
            if job_id not in stopping:
                continue  # finished while stopping
            _, kept = stopping.pop(job_id)
            job = jobs[job_id]
            job.remaining = job.task.duration - kept
            job.done_before = kept
            job.attempt += 1
            r = job.request
            walltime = max(60.0, r.walltime_s - (kept - r.attained_s)) if r.walltime_s is not None else None
            job.request = replace(r, walltime_s=walltime, attained_s=kept, preemptions=job.preempted)
            queued[job_id] = job.request
            idle_while_waiting.wait(job.request)
        while wakeups and wakeups[0] <= t:
            heapq.heappop(wakeups)
        if not queued:
            idle_rates = (0.0, 0.0, 0.0, 0.0, max(0.0, total_gpus - busy_gpus))
            continue
        # A running job becomes preemptible once it has a checkpoint (an epoch done).
        for job_id, alloc in running.items():
            if not alloc.preemptible:
                job = jobs[job_id]
                if job.spec_preemptible and job.progress(t) >= job.epoch_s:
                    running[job_id] = replace(alloc, preemptible=True)
        if quota_s is not None and rolling is not None:
            waiting_users = {q.user for q in queued.values()}
            for alloc in running.values():
                excess = rolling.total(alloc.user, t) - quota_s
                if excess > over_quota_excess and waiting_users - {alloc.user}:
                    over_quota_excess = excess
        state = ClusterState(
            nodes=nodes,
            running=tuple(running.values()),
            queued=tuple(queued.values()),
            config=config,
            usage=usage.snapshot(t),
            user_usage_24h={u: rolling.total(u, t) for u in rolling.keys()} if rolling else {},
            user_usage_expiry={u: rolling.expiries(u, t) for u in rolling.keys()} if rolling else {},
            team_urgent_usage_24h={k: urgent_rolling.total(k, t) for k in urgent_rolling.keys()},
            explain_only=frozenset(new_ids),
            inflow=tuple(recent),
            eta_history=tuple((p, a) for _, p, a in eta_history),
        )
        result = plan(state, t)
        passes += 1
        stop_of: dict[str, float] = {}  # preempting job -> when its last victim has stopped
        for pre in result.preemptions:
            alloc = running.pop(pre.job_id)
            busy_gpus -= alloc.gpus
            idle_while_waiting.take(alloc, -1)
            job = jobs[pre.job_id]
            done = job.progress(t)
            boundary = math.ceil(done / job.epoch_s - 1e-9) * job.epoch_s
            if model.graceful and boundary - done <= pre.grace_s:
                stop, kept = t + (boundary - done), boundary
            elif model.graceful:
                stop, kept = t + pre.grace_s, math.floor(done / job.epoch_s + 1e-9) * job.epoch_s
            else:
                stop, kept = t, math.floor(done / job.epoch_s + 1e-9) * job.epoch_s
            kept = max(job.done_before, min(kept, job.task.duration))
            progress_at_stop = job.progress(stop)
            if progress_at_stop >= job.task.duration - 1e-9:
                stop = t + (job.task.duration - done)  # it ends before it would stop: let it finish
            for index in alloc.gpu_indices:
                key = (alloc.node, index)
                held_until[key] = max(held_until.get(key, t), stop)
            if progress_at_stop >= job.task.duration - 1e-9:
                stop_of[pre.by_job_id] = max(stop_of.get(pre.by_job_id, t), stop)
                stopping[pre.job_id] = (stop, job.task.duration)
                continue
            job.lost_s += max(0.0, progress_at_stop - kept) + (model.restart_s if kept > 0 else 0.0)
            job.lost_s += max(0.0, min(stop, job.run_from) - t)  # time lost in its own restart
            job.preempted += 1
            preemptions += 1
            stopping[pre.job_id] = (stop, kept)
            heapq.heappush(requeues, (stop, pre.job_id))
            stop_of[pre.by_job_id] = max(stop_of.get(pre.by_job_id, t), stop)
        for start in result.starts:
            job = jobs[start.job_id]
            request = queued.pop(start.job_id)
            idle_while_waiting.unwait(request)
            alloc = Allocation(
                job_id=start.job_id,
                team=request.team,
                user=request.user,
                node=start.node,
                gpu_indices=start.gpu_indices,
                gpu_share=start.gpu_share,
                gpu_memory_mb=request.gpu_memory_mb,
                cpu_milli=request.cpu_milli,
                memory_mb=request.memory_mb,
                priority_class=start.priority_class or request.priority_class,
                started_at=t,
                expected_end=t + request.walltime,
                preemptible=job.spec_preemptible and job.done_before > 0,
                attained_s=job.done_before,
                preemptions=job.preempted,
                estimated=request.estimated,
                # The live bound, as the policy sees it (no trace task comes near the year's
                # timeout, and the replay never stops a job at it).
                ends_by=t + request.limit,
            )
            running[start.job_id] = alloc
            busy_gpus += alloc.gpus
            idle_while_waiting.take(alloc)
            if job.first_start is None:
                job.first_start = t
                if job.eta_model_at_submit is not None and t - job.task.submit <= HISTORY_MAX_WAIT_S:  # it waited
                    submit = job.task.submit
                    eta_history.append((t, max(0.0, job.eta_model_at_submit - submit), t - submit))
            ready = stop_of.get(start.job_id, t)
            for index in start.gpu_indices:
                ready = max(ready, held_until.get((start.node, index), t))
            job.run_from = ready + (model.restart_s if job.done_before > 0 else 0.0)
            heapq.heappush(completions, (job.run_from + job.remaining, start.job_id, job.attempt))
        if new_ids:
            entries = {e.job_id: e for e in result.queue}
            for job_id in new_ids:
                job = jobs[job_id]
                entry = entries.get(job_id)
                if entry is None:  # started in this pass
                    job.eta_at_submit = job.eta_low = job.eta_high = t
                else:
                    job.eta_at_submit = entry.estimated_start
                    job.eta_model_at_submit = (
                        entry.estimated_start_model if entry.estimated_start_model is not None else entry.estimated_start
                    )
                    job.eta_low = entry.estimated_start_low
                    job.eta_high = entry.estimated_start_high
                    job.eta_position = entry.position
        if queued:
            idle_rates = (*idle_while_waiting.rates(partial(_reserved_gpus, result)), 0.0)
        else:
            idle_rates = (0.0, 0.0, 0.0, 0.0, max(0.0, total_gpus - busy_gpus))
        if result.wake_at is not None and result.wake_at > t:
            heapq.heappush(wakeups, result.wake_at)
        queue_samples.append((t, len(queued)))

    return _metrics(
        jobs,
        rejected,
        busy_area,
        total_gpus,
        window,
        preemptions,
        passes,
        queue_samples,
        timeline_points,
        over_quota_excess,
    ) | _work_conservation(
        total_gpus,
        window,
        last_t,
        busy_area,
        busy_area_all,
        idle_area,
        idle_area_all,
    )


def _reserved_gpus(result: Plan) -> dict[str, float]:
    """GPUs the pass's reservations hold, per node."""
    need: dict[str, float] = {}
    for _, node, gpus in result.reservations:
        need[node] = need.get(node, 0.0) + gpus
    return need


def _work_conservation(
    total_gpus: float,
    window: tuple[float, float],
    end: float,
    busy_area: float,
    busy_area_all: float,
    idle_area: Sequence[float],
    idle_area_all: Sequence[float],
) -> dict:
    """Idle GPU-hours while a waiting job could have used them (:class:`IdleWhileWaiting`).

    Over the arrival window (as ``utilization``) and over the whole replay (first arrival
    to the last event); each also as a fraction of capacity over that span. Beside it, the
    other ways a GPU is idle: held for a reservation while another job fits it, short of CPU
    or RAM for every waiting job that fits its GPUs, kept for a reservation where no waiting
    job fits, and no job waiting at all; what is left of ``idle_gpu_hours`` is free GPUs
    that no waiting job's GPU request fits and no reservation holds (too wide for the
    node's free GPUs, or of another model).
    """
    capacity = total_gpus * (window[1] - window[0])
    capacity_all = total_gpus * (end - window[0])

    def share(area: float, cap: float) -> float:
        return area / cap if cap > 0 else 0.0

    out = {
        "idle_gpu_hours": (capacity - busy_area) / 3600.0,
        "utilization_all": share(busy_area_all, capacity_all),
        "idle_gpu_hours_all": (capacity_all - busy_area_all) / 3600.0,
        "replay_span_s": end - window[0],
    }
    names = (
        "idle_while_waiting",
        "held_for_reservation",
        "short_of_cpu_or_ram",
        "kept_for_reservation",
        "idle_no_job_waiting",
    )
    for name, area, area_all in zip(names, idle_area, idle_area_all, strict=True):
        out[f"{name}_gpu_hours"] = area / 3600.0
        out[f"{name}_fraction"] = share(area, capacity)
        out[f"{name}_gpu_hours_all"] = area_all / 3600.0
        out[f"{name}_fraction_all"] = share(area_all, capacity_all)
    return out


def _metrics(
    jobs: dict[str, _Job],
    rejected: int,
    busy_area: float,
    total_gpus: float,
    window: tuple[float, float],
    preemptions: int,
    passes: int,
    queue_samples: list[tuple[float, int]],
    timeline_points: int,
    over_quota_excess: float,
) -> dict:
    finished = [j for j in jobs.values() if j.finish is not None]
    waits = sorted(j.finish - j.task.submit - j.task.duration for j in finished)
    jcts = [j.finish - j.task.submit for j in finished]
    per_user: dict[str, list[float]] = {}
    rho_num: dict[str, float] = {}
    rho_den: dict[str, float] = {}
    for j in finished:
        user = j.request.user
        jct = j.finish - j.task.submit
        per_user.setdefault(user, []).append((j.task.duration + BOUNDED_SLOWDOWN_S) / (jct + BOUNDED_SLOWDOWN_S))
        # Themis: time alone on a 1/N share of the cluster, N = users with work at submit.
        fair_gpus = total_gpus / max(1, j.active_users)
        alone = j.task.duration * max(1.0, j.task.gpus / fair_gpus)
        rho_num[user] = rho_num.get(user, 0.0) + jct + BOUNDED_SLOWDOWN_S
        rho_den[user] = rho_den.get(user, 0.0) + alone + BOUNDED_SLOWDOWN_S
    rhos = sorted(rho_num[u] / rho_den[u] for u in rho_num)
    with_eta = [j for j in finished if j.first_start is not None and j.eta_at_submit is not None]
    eta_errors = [abs(j.eta_at_submit - j.first_start) for j in with_eta]
    ranged = [j for j in finished if j.first_start is not None]
    covered = {
        j.task.name
        for j in ranged
        if j.eta_low is not None and j.eta_high is not None and j.eta_low - 1.0 <= j.first_start <= j.eta_high + 1.0
    }
    widths = [j.eta_high - j.eta_low for j in ranged if j.eta_low is not None and j.eta_high is not None]
    waited = [j for j in ranged if j.first_start > j.task.submit]
    span = window[1] - window[0]
    step = max(1, len(queue_samples) // timeline_points)
    preempted = [j.preempted for j in jobs.values()]
    return {
        "jobs": len(finished),
        "rejected": rejected,
        "never_started": sum(1 for j in jobs.values() if j.first_start is None),
        "unfinished": len(jobs) - len(finished),
        "mean_wait_s": statistics.fmean(waits) if waits else 0.0,
        "p50_wait_s": _percentile(waits, 0.50),
        "p95_wait_s": _percentile(waits, 0.95),
        "p99_wait_s": _percentile(waits, 0.99),
        "max_wait_s": waits[-1] if waits else 0.0,
        "mean_jct_s": statistics.fmean(jcts) if jcts else 0.0,
        "utilization": busy_area / (total_gpus * span) if span > 0 else 0.0,
        "jain_fairness": jain(statistics.fmean(v) for v in per_user.values()),
        "rho_p95": _percentile(rhos, 0.95),
        "rho_max": rhos[-1] if rhos else 0.0,
        "users_rho_le_2": sum(1 for r in rhos if r <= 2.0) / len(rhos) if rhos else 1.0,
        "eta_mae_s": statistics.fmean(eta_errors) if eta_errors else 0.0,
        "eta_count": len(eta_errors),
        "eta_coverage": len(covered) / len(ranged) if ranged else 1.0,
        "eta_width_mean_s": statistics.fmean(widths) if widths else 0.0,
        "eta_coverage_waiting": (sum(1 for j in waited if j.task.name in covered) / len(waited) if waited else 1.0),
        "jobs_waiting_at_submit": len(waited),
        "preemptions": preemptions,
        "jobs_preempted": sum(1 for p in preempted if p),
        "max_preemptions_per_job": max(preempted, default=0),
        "lost_gpu_hours": sum(j.lost_s * j.task.gpus for j in jobs.values()) / 3600.0,
        "over_quota_excess_gpu_hours": over_quota_excess / 3600.0,
        "passes": passes,
        "_waits": waits,
        "_queue": queue_samples[::step],
    }


def run_simulation(
    trace_path: str,
    nodes_spec: str,
    policies: Sequence[str | tuple[str, PolicyConfig]] = ("fifo", "fair"),
    seed: int = 0,
    load: float | None = None,
    *,
    users: int = 40,
    teams: int = 6,
    zipf_s: float = 1.1,
    walltime_sigma: float = 0.5,
    model: JobModel | None = None,
    max_tasks: int | None = None,
    plot_path: str | None = None,
) -> dict:
    """Replay the trace under each policy and return the metrics (JSON-ready).

    ``policies`` are names (``fifo``, ``fair``: shipped defaults, except that the fair
    policy runs without per-user GPU-hour quotas, which the trace knows nothing about) or
    ``(label, PolicyConfig)`` pairs for variants. Same trace, owners and estimates for all.
    """
    tasks, skipped = load_trace(trace_path)
    if max_tasks is not None:
        tasks = tasks[:max_tasks]
    nodes = load_nodes(nodes_spec)
    total_gpus = float(sum(len(n.gpus) for n in nodes))
    original_load = offered_load(tasks, total_gpus)
    if load is not None:
        tasks = rescale(tasks, total_gpus, load)
    owners = assign_users(len(tasks), seed, users, teams, zipf_s)
    result: dict = {
        "trace": trace_path,
        "nodes": nodes_spec,
        "gpus": total_gpus,
        "seed": seed,
        "tasks": len(tasks),
        "skipped": skipped,
        "offered_load": offered_load(tasks, total_gpus),
        "trace_load_on_this_cluster": original_load,
        "users": users,
        "teams": teams,
        "zipf_s": zipf_s,
        "walltime_sigma": walltime_sigma,
        "job_model": asdict(model or JobModel()),
        "policies": {},
    }
    series = {}
    for entry in policies:
        if isinstance(entry, str):
            label = entry
            config = PolicyConfig(policy=entry, user_gpu_hours_per_day=None)
        else:
            label, config = entry
        metrics = simulate_policy(tasks, owners, nodes, config, seed=seed, walltime_sigma=walltime_sigma, model=model)
        series[label] = (metrics.pop("_waits"), metrics.pop("_queue"))
        result["policies"][label] = metrics
    fitting = [
        t
        for t, (team, user) in zip(tasks, owners, strict=True)
        if admission_error(
            nodes,
            JobRequest(
                t.name,
                team,
                user,
                t.submit,
                t.gpus,
                gpu_models=t.gpu_models,
                cpu_milli=t.cpu_milli,
                memory_mb=t.memory_mb,
            ),
            PolicyConfig(user_gpu_hours_per_day=None),
        )
        is None
    ]
    srpt = srpt_lower_bound(fitting, total_gpus)
    mean_duration = statistics.fmean(t.duration for t in fitting) if fitting else 0.0
    result["lower_bound"] = {
        "mean_jct_s": max(srpt, mean_duration),
        "srpt_pooled_mean_jct_s": srpt,
        "mean_duration_s": mean_duration,
    }
    if plot_path:
        write_plot(plot_path, series, result)
    return result


def write_plot(path: str, series: dict, result: dict) -> None:
    """Wait-time CDF and queue length over time, one line per policy (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for label, (waits, queue) in series.items():
        if waits:
            xs = [max(w, 1.0) for w in waits]
            ys = [(k + 1) / len(xs) for k in range(len(xs))]
            ax1.plot(xs, ys, label=label)
        if queue:
            ax2.plot([q[0] / 86400 for q in queue], [q[1] for q in queue], label=label, linewidth=0.8)
    ax1.set_xscale("log")
    ax1.set_xlabel("wait (s, log; < 1 s shown at 1 s)")
    ax1.set_ylabel("fraction of jobs")
    ax1.set_title("Wait-time CDF")
    ax1.grid(True, which="both", alpha=0.3)
    ax1.legend()
    ax2.set_xlabel("simulated day")
    ax2.set_ylabel("queued jobs")
    ax2.set_title("Queue length")
    ax2.grid(True, alpha=0.3)
    ax2.legend()
    fig.suptitle(
        f"{result['trace'].rsplit('/', 1)[-1]} on {result['nodes']} "
        f"({result['gpus']:g} GPUs), offered load {result['offered_load']:.2f}, seed {result['seed']}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
