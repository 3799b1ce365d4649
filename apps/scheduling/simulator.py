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

import csv
import heapq
import math
import random
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from .policy import (
    Allocation,
    ClusterState,
    DecayedUsage,
    GpuInfo,
    JobRequest,
    NodeInfo,
    PolicyConfig,
    RollingUsage,
    admission_error,
    plan,
)

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
    """``NxG`` (N nodes of G GPUs) or an openb node list CSV (sn, cpu_milli, memory_mib, gpu, model)."""
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
    nodes = []
    with open(spec, newline="") as fh:
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
    return tuple(nodes)


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


@dataclass
class _Job:
    task: TraceTask
    request: JobRequest
    remaining: float  # true seconds of work left
    done_before: float = 0.0  # work kept from earlier attempts
    attempt: int = 0
    first_start: float | None = None
    finish: float | None = None
    eta_at_submit: float | None = None
    preempted: int = 0


def simulate_policy(
    tasks: Sequence[TraceTask],
    owners: Sequence[tuple[str, str]],
    nodes: tuple[NodeInfo, ...],
    config: PolicyConfig,
    *,
    seed: int = 0,
    walltime_sigma: float = 0.5,
    checkpoint_s: float = 600.0,
    timeline_points: int = 400,
) -> dict:
    """Replay ``tasks`` through ``plan()`` under ``config``; metrics as a dict."""
    rng = random.Random(seed + 7919)
    total_gpus = float(sum(len(n.gpus) for n in nodes if n.schedulable))
    jobs: dict[str, _Job] = {}
    arrivals: list[_Job] = []
    rejected = 0
    for task, (team, user) in zip(tasks, owners, strict=True):
        noise = math.exp(rng.gauss(0.0, walltime_sigma)) if walltime_sigma > 0 else 1.0
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
            walltime_s=max(60.0, task.duration * noise),
        )
        if admission_error(nodes, request, config) is not None:
            rejected += 1
            continue
        job = _Job(task, request, task.duration)
        jobs[task.name] = job
        arrivals.append(job)

    usage = DecayedUsage(config.half_life_s)
    rolling = RollingUsage() if config.user_gpu_hours_per_day is not None else None
    urgent_rolling = RollingUsage()
    running: dict[str, Allocation] = {}
    queued: dict[str, JobRequest] = {}
    completions: list[tuple[float, str, int]] = []  # (time, job id, attempt)
    wakeups: list[float] = []
    preemptions = 0
    busy_gpus = 0.0
    busy_area = 0.0
    window = (arrivals[0].task.submit, arrivals[-1].task.submit) if arrivals else (0.0, 0.0)
    last_t = window[0]
    queue_samples: list[tuple[float, int]] = []
    i = 0
    passes = 0

    def charge(until: float) -> None:
        nonlocal last_t, busy_area
        dt = until - last_t
        if dt <= 0:
            return
        lo, hi = max(last_t, window[0]), min(until, window[1])
        if hi > lo:
            busy_area += busy_gpus * (hi - lo)
        for alloc in running.values():
            used = alloc.gpus * dt
            usage.add((alloc.team, alloc.user), used, until)
            if rolling is not None:
                rolling.add(alloc.user, used, until)
            if alloc.priority_class == "urgent":
                urgent_rolling.add(alloc.team, used, until)
        last_t = until

    while i < len(arrivals) or completions or (wakeups and queued):
        t = math.inf
        if i < len(arrivals):
            t = arrivals[i].task.submit
        if completions:
            t = min(t, completions[0][0])
        if wakeups and queued:
            t = min(t, wakeups[0])
        if t == math.inf:
            break
        charge(t)
        new_ids: list[str] = []
        while i < len(arrivals) and arrivals[i].task.submit <= t:
            job = arrivals[i]
            queued[job.request.job_id] = job.request
            new_ids.append(job.request.job_id)
            i += 1
        while completions and completions[0][0] <= t:
            _, job_id, attempt = heapq.heappop(completions)
            job = jobs[job_id]
            if attempt != job.attempt or job_id not in running:
                continue  # a stale completion of a preempted attempt
            alloc = running.pop(job_id)
            busy_gpus -= alloc.gpus
            job.finish = t
            job.remaining = 0.0
        while wakeups and wakeups[0] <= t:
            heapq.heappop(wakeups)
        if not queued:
            continue
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
        )
        result = plan(state, t)
        passes += 1
        for pre in result.preemptions:
            alloc = running.pop(pre.job_id)
            busy_gpus -= alloc.gpus
            job = jobs[pre.job_id]
            ran = t - alloc.started_at
            kept = math.floor(ran / checkpoint_s) * checkpoint_s if checkpoint_s > 0 else ran
            kept = min(kept, job.remaining)
            job.remaining -= kept
            job.done_before += kept
            job.attempt += 1
            job.preempted += 1
            preemptions += 1
            queued[pre.job_id] = replace(job.request, walltime_s=max(60.0, (job.request.walltime_s or 60.0) - kept))
        for start in result.starts:
            job = jobs[start.job_id]
            request = queued.pop(start.job_id)
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
                preemptible=request.priority_class in ("low", "medium"),
            )
            running[start.job_id] = alloc
            busy_gpus += alloc.gpus
            if job.first_start is None:
                job.first_start = t
            heapq.heappush(completions, (t + job.remaining, start.job_id, job.attempt))
        if new_ids:
            etas = {e.job_id: e.estimated_start for e in result.queue}
            for job_id in new_ids:
                job = jobs[job_id]
                job.eta_at_submit = etas[job_id] if job_id in etas else t
        if result.wake_at is not None and result.wake_at > t:
            heapq.heappush(wakeups, result.wake_at)
        queue_samples.append((t, len(queued)))

    finished = [j for j in jobs.values() if j.finish is not None]
    waits = sorted(j.finish - j.task.submit - j.task.duration for j in finished)
    jcts = [j.finish - j.task.submit for j in finished]
    per_user: dict[str, list[float]] = {}
    for j in finished:
        per_user.setdefault(j.request.user, []).append(
            (j.task.duration + BOUNDED_SLOWDOWN_S) / (j.finish - j.task.submit + BOUNDED_SLOWDOWN_S)
        )
    eta_errors = [
        abs(j.eta_at_submit - j.first_start)
        for j in finished
        if j.eta_at_submit is not None and j.first_start is not None
    ]
    span = window[1] - window[0]
    step = max(1, len(queue_samples) // timeline_points)
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
        "eta_mae_s": statistics.fmean(eta_errors) if eta_errors else 0.0,
        "eta_count": len(eta_errors),
        "preemptions": preemptions,
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
    checkpoint_s: float = 600.0,
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
        "policies": {},
    }
    series = {}
    for entry in policies:
        if isinstance(entry, str):
            label = entry
            config = PolicyConfig(policy=entry, user_gpu_hours_per_day=None)
        else:
            label, config = entry
        metrics = simulate_policy(
            tasks, owners, nodes, config, seed=seed, walltime_sigma=walltime_sigma, checkpoint_s=checkpoint_s
        )
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
