"""Time the live scheduler pass (``apps.scheduling.loop.plan_and_start``) on a full database.

    python bench/live_pass.py [--database sqlite|postgres] [--queued 1000,10000] [--repeat 5] [--whole] [--json out.json]

bench/scheduler_pass.py times only the pure policy. The live pass also builds the
ClusterState from the database (``inputs.cluster_state``, recent arrivals and usage
included), claims the planned starts and writes every waiting job's position, ETA, reason
and priority back (``loop.queue_update``, one UPDATE per changed row). This bench runs it
in this process through the ORM on a throwaway database (common.Stack; no web, worker or
scheduler process) holding:

- 16 nodes × 8 simulated GPUs (``--nodes``, ``--gpus-per-node``), filled by the scheduler
  itself with submitted jobs of 8, 4, 2 and 1 GPUs from 20 teams (each started as a worker
  would start it, ``attempt_start``) until it starts nothing more: the queue waits;
- ``--history`` finished jobs of those teams over the last days, with their usage records
  (runtime estimates and fair share have something to go on) and the first ETA each was
  given (waits of 5 minutes against predictions of 0–10 minutes), so the pass reads the
  ETAs' track record and calibrates as a live one does (until 3 December, 08:40 UTC, they had
  none: the calibration and its query were skipped);
- the queue: ``--queued`` jobs (one INSERT … SELECT, as tests/jobs/bulk.py does) of 1, 2, 4
  and 8 GPUs, classes low to urgent, 10 to 100 epochs, submitted over the last three days.

Scenarios, each the median over ``--repeat`` passes of wall time, this process's CPU time
(``time.process_time``; the database server's is not in it on PostgreSQL), the queries and
the ``UPDATE "jobs_job"`` statements of the pass:

1. steady: nothing changed since the previous pass but the clock (the seconds the passes
   took: ages, running jobs' usage and so priorities and ETAs move with it, so a pass may
   still rewrite rows; per-pass counts are in the JSON);
2. submit: one urgent 2-GPU job submitted just before the pass (``job_submit``; urgent
   jobs are ranked first, within the team's urgent allowance), so the positions of
   (nearly) all the queue behind it shift (``submitted_positions`` say where it went);
3. finish: the largest running job succeeded just before the pass (``attempt_finish``,
   the worker's own report), so GPUs free and starts are planned and claimed (``starts``).

The passes keep the queue's rows between them, as the scheduler's own loop does
(``inputs.QueueRows``: each pass reads only new or changed rows; the first reads the whole
queue); ``--whole`` reads the whole queue every pass instead, as a one-off pass does (and
every pass did before QueueRows) — the baseline to run beside it.

Beside each, in the same run and alternating with it: the pass's parts, timed by calling
them one after the other as the pass does (``cluster_state``, ``policy.plan``,
``queue_update``, after the same kind of change; "other" is what the whole pass took
beyond their sum: claims, dispatch, events; a difference of medians of different passes,
so it can come out below zero), and the pure policy call alone on one state
built once (``policy.plan``, as bench/scheduler_pass.py times it), so ``live/pure`` says
what the database around the policy costs. Queries are counted with a connection
execute wrapper (cheaper than CaptureQueriesContext, which formats every statement).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import Stack, machine, median, rounded

TEAMS = 20
SIZES = [8] * 6 + [4] * 8 + [2] * 12 + [1] * 20  # 124 GPUs of running work asked for at the start
EPOCHS = (10, 20, 30, 50, 100)


# --- filling the database ----------------------------------------------------------------------


def owners_make() -> list:
    """20 teams with a user each (vision and robotics from demo_setup; the rest made here),
    each with the demo dataset, so every owner can submit."""
    from django.conf import settings
    from django.contrib.auth import get_user_model

    from apps.accounts.models import Team
    from apps.accounts.services import membership_set, team_ensure
    from apps.datasets.demo import generate_demo_dataset
    from apps.datasets.services import dataset_register

    users = get_user_model().objects
    owners = [(Team.objects.get(slug="vision"), users.get(username="alice")),
              (Team.objects.get(slug="robotics"), users.get(username="carol"))]
    data_yaml = generate_demo_dataset(settings.DATASETS_DIR / "_shared" / "demo")
    for t in range(TEAMS - len(owners)):
        team = team_ensure(slug=f"bench-team-{t}")
        user, _ = users.get_or_create(username=f"bench-{t}", defaults={"password": "!"})
        membership_set(user=user, team=team, role="member")
        dataset_register(team=team, name="demo", yaml_path=data_yaml)
        owners.append((team, user))
    return owners


def nodes_register(count: int, gpus: int) -> None:
    from apps.cluster.models import Node
    from worker.inventory import simulated_gpus
    from worker.node import register_this_host

    for i in range(count):
        register_this_host(name=f"bench-node-{i:02d}", gpus=simulated_gpus(gpus), cpus=8 * gpus,
                           memory_mb=128 * 1024 * gpus, images=[], features=[],
                           limits={"version": "", "enforced": [], "summary": "bench"})
    assert Node.objects.count() == count


def heartbeat() -> None:
    """What the workers' heartbeats do between passes (a node silent for 15 s gets no work)."""
    from django.utils import timezone

    from apps.cluster.models import Node

    Node.objects.update(last_heartbeat=timezone.now())


def submit(user, *, gpus: float, epochs: int, priority: str = "medium", name: str = "bench"):
    from apps.jobs.services import job_submit
    from apps.jobs.spec import parse_spec

    job, _ = job_submit(user=user, spec=parse_spec({
        "task_name": name, "command": f"yolo train data=demo model=yolov8n.yaml epochs={epochs} imgsz=320",
        "resources": {"gpu": gpus}, "priority": priority, "timeout": 12 * 3600, "allow_duplicate": True}))
    return job


def start_claimed() -> int:
    """Start every claimed (starting) attempt as its worker would; returns how many."""
    from apps.jobs.models import Job, JobState
    from apps.jobs.services import attempt_start

    started = 0
    for job_id, attempt_id, node in Job.objects.filter(state=JobState.STARTING).values_list(
            "pk", "attempt_id", "node__name"):
        started += attempt_start(job_id=job_id, attempt_id=attempt_id, node_name=node) is not None
    return started


def settle(limit: int = 10) -> int:
    """Passes until one starts nothing; returns the passes run."""
    from apps.scheduling.loop import plan_and_start

    for n in range(1, limit + 1):
        heartbeat()
        did = plan_and_start()
        start_claimed()
        if not did:
            return n
    return limit


def history_insert(count: int, owners: list, template) -> None:
    """``count`` finished jobs over the last ~3 days with one usage record each."""
    from django.db import connection

    from apps.jobs.models import Job
    from apps.quotas.models import UsageRecord
    from tests.jobs.bulk import _ago_sql, _case, _uuid_sql, insert_rows

    i, owner = "n.i", f"(n.i % {len(owners)})"
    runtime = f"({_epochs_sql(i)} * 40 * (10 + {i} % 7) / 10)"  # ~40 s an epoch, ±30 %
    ago = f"({i} * {3 * 86400 // max(count, 1)} + 60)"
    insert_rows(Job, count=count, expressions={
        "id": _uuid_sql(), "attempt_id": _uuid_sql(),
        "task_name": f"'done-' || {i}", "spec_hash": f"'d' || {i}",
        "team_id": _case(owner, [team.pk for team, _ in owners]),
        "user_id": _case(owner, [user.pk for _, user in owners]),
        "state": f"CASE WHEN {i} % 9 = 0 THEN 'failed' ELSE 'succeeded' END",
        "spec": _spec_sql(i, template.spec),
        "gpus": _gpus_sql(i),
        "priority_class": _class_sql(i),
        "created_at": _ago_sql(f"{ago} + {runtime} + 300"),
        "queued_at": _ago_sql(f"{ago} + {runtime} + 300"),
        "started_at": _ago_sql(f"{ago} + {runtime}"),
        "first_started_at": _ago_sql(f"{ago} + {runtime}"),
        # the first ETA it was given: 0-10 minutes after its submit (it waited 5)
        "predicted_start_at": _ago_sql(f"{ago} + {runtime} + 300 - ({i} % 11) * 60"),
        "predicted_model_start_at": _ago_sql(f"{ago} + {runtime} + 300 - ({i} % 11) * 60"),
        "finished_at": _ago_sql(ago),
    }, values={"timeout_s": template.timeout_s, "raw_spec": template.raw_spec, "cpu_milli": template.cpu_milli,
               "memory_mb": template.memory_mb})
    if connection.vendor == "postgresql":
        seconds = "extract(epoch from j.finished_at - j.started_at)"
    else:
        seconds = "(julianday(j.finished_at) - julianday(j.started_at)) * 86400"
    insert_rows(UsageRecord, count=1, join=(
        f"CROSS JOIN (SELECT id, team_id, user_id, gpus, priority_class, started_at, finished_at FROM "
        f"{Job._meta.db_table} WHERE state IN ('succeeded', 'failed') AND task_name LIKE 'done-%') j"),
        expressions={"job_id": "j.id", "team_id": "j.team_id", "user_id": "j.user_id",
                     "priority_class": "j.priority_class", "gpu_seconds": f"j.gpus * {seconds}",
                     "started_at": "j.started_at", "ended_at": "j.finished_at"}, values={"attempt": 1})


def queue_insert(count: int, owners: list, template) -> None:
    """``count`` queued jobs submitted over the last three days (a third of them in the last day)."""
    from django.db import connection

    from apps.jobs.models import Job
    from tests.jobs.bulk import _ago_sql, _case, _uuid_sql, insert_rows

    i, owner = "n.i", f"(n.i * 7 % {len(owners)})"
    ago = f"({i} * {3 * 86400 // max(count, 1)} + 30)"
    insert_rows(Job, count=count, expressions={
        "id": _uuid_sql(), "attempt_id": _uuid_sql(),
        "task_name": f"'queued-' || {i}", "spec_hash": f"'q' || {i}",
        "team_id": _case(owner, [team.pk for team, _ in owners]),
        "user_id": _case(owner, [user.pk for _, user in owners]),
        "spec": _spec_sql(i, template.spec),
        "gpus": _gpus_sql(i),
        "priority_class": _class_sql(i),
        "created_at": _ago_sql(ago),
        "queued_at": _ago_sql(ago),
    }, values={"state": "queued", "timeout_s": template.timeout_s, "raw_spec": template.raw_spec,
               "cpu_milli": template.cpu_milli, "memory_mb": template.memory_mb,
               "reason": "waiting for the scheduler"})
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")


def _epochs_sql(i: str) -> str:
    return "CASE " + " ".join(f"WHEN {i} % {len(EPOCHS)} = {k} THEN {e}" for k, e in enumerate(EPOCHS)) + " END"


def _gpus_sql(i: str) -> str:
    """1 GPU for half the jobs, 2 for a quarter, 4 for 15 %, 8 for 10 %."""
    return f"CASE WHEN {i} % 20 < 10 THEN 1.0 WHEN {i} % 20 < 15 THEN 2.0 WHEN {i} % 20 < 18 THEN 4.0 ELSE 8.0 END"


def _class_sql(i: str) -> str:
    """low 20 %, medium 60 %, high 18 %, urgent 2 % (the same spread as bench/scheduler_pass.py)."""
    return (f"CASE WHEN {i} % 50 < 10 THEN 'low' WHEN {i} % 50 < 40 THEN 'medium' "
            f"WHEN {i} % 50 < 49 THEN 'high' ELSE 'urgent' END")


def _spec_sql(i: str, spec: dict) -> str:
    """The submitted template's spec with the epochs varied (one JSON literal per choice)."""
    from django.db import connection

    choices = []
    for k, epochs in enumerate(EPOCHS):
        variant = {**spec, "train_args": {**spec.get("train_args", {}), "epochs": epochs}}
        literal = "'" + json.dumps(variant).replace("'", "''") + "'"
        if connection.vendor == "postgresql":
            literal = f"CAST({literal} AS jsonb)"
        choices.append(f"WHEN {i} % {len(EPOCHS)} = {k} THEN {literal}")
    return "CASE " + " ".join(choices) + " END"


def fill(args) -> tuple[dict, list]:
    """The whole database; returns what it holds and the (team, user) owners."""
    from django.db import transaction

    from apps.jobs.models import Job, JobState
    from apps.scheduling.loop import plan_and_start

    owners = owners_make()
    nodes_register(args.nodes, args.gpus_per_node)
    # The running work, submitted and started through the scheduler itself.
    for k, gpus in enumerate(size for size in SIZES * (args.nodes * args.gpus_per_node // 128 or 1)):
        _, user = owners[k % len(owners)]
        submit(user, gpus=gpus, epochs=EPOCHS[k % len(EPOCHS)], name=f"running-{k}")
    passes = 0
    while Job.objects.filter(state=JobState.QUEUED).exists() and passes < 10:
        heartbeat()
        plan_and_start()
        start_claimed()
        passes += 1
    template = Job.objects.filter(state=JobState.RUNNING, gpus=1).first() or Job.objects.first()
    with transaction.atomic():
        history_insert(args.history, owners, template)
        queue_insert(args.queued, owners, template)
    passes = settle()
    counts = {state: Job.objects.filter(state=state).count() for state in JobState.values}
    busy = sum(Job.objects.filter(state=JobState.RUNNING).values_list("gpus", flat=True))
    return {"jobs_by_state": {k: v for k, v in counts.items() if v}, "gpus_busy": busy,
            "gpus": args.nodes * args.gpus_per_node, "settle_passes": passes}, owners


# --- measuring ---------------------------------------------------------------------------------


class Counter:
    """Counts the statements this connection runs (an execute wrapper: no SQL formatting)."""

    def __init__(self) -> None:
        self.queries = self.updates = 0

    def __call__(self, execute, sql, params, many, context):
        self.queries += 1
        if sql.startswith('UPDATE "jobs_job"'):
            self.updates += 1
        return execute(sql, params, many, context)


def timed(fn):
    """(result, wall s, CPU s, queries, job UPDATEs) of ``fn()``."""
    from django.db import connection

    counter = Counter()
    with connection.execute_wrapper(counter):
        wall, cpu = time.perf_counter(), time.process_time()
        result = fn()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return result, wall, cpu, counter.queries, counter.updates


class Change:
    """What happens before a scenario's pass."""

    def __init__(self, owners: list) -> None:
        self.owners = owners
        self.n = 0

    def steady(self) -> str:
        return ""

    def submit(self) -> str:
        self.n += 1
        _, user = self.owners[self.n % len(self.owners)]
        job = submit(user, gpus=2, epochs=30, priority="urgent", name=f"urgent-{self.n}")
        return str(job.pk)

    def finish(self) -> str:
        from apps.jobs.models import Job, JobState
        from apps.jobs.services import attempt_finish

        # The largest, oldest: a whole node frees, so the queue's head (often waiting for
        # several GPUs, which a reservation holds for it) can start.
        job = Job.objects.filter(state=JobState.RUNNING).order_by("-gpus", "started_at").first()
        attempt_finish(job, outcome="succeeded", finished={})
        return str(job.pk)


def position(job_id: str) -> int | None:
    from apps.jobs.models import Job

    return Job.objects.filter(pk=job_id).values_list("queue_position", flat=True).first() if job_id else None


def live_pass(change, rows) -> dict:
    from apps.scheduling.loop import plan_and_start

    changed = change()
    heartbeat()
    _, wall, cpu, queries, updates = timed(lambda: plan_and_start(rows=rows))
    started = start_claimed()
    return {"wall": wall, "cpu": cpu, "queries": queries, "updates": updates, "starts": started,
            "changed_position": position(changed) if change.__name__ == "submit" else None}


def split_pass(change, rows) -> dict:
    """The pass's parts one after the other, as plan_and_start calls them, then the pass
    itself (untimed) so its claims are made as they would be."""
    from django.utils import timezone

    from apps.scheduling import policy
    from apps.scheduling.inputs import cluster_state
    from apps.scheduling.loop import plan_and_start, queue_update

    change()
    heartbeat()
    now = timezone.now()
    (state, jobs_by_id), build_wall, build_cpu, build_queries, _ = timed(lambda: cluster_state(now, rows))
    result, plan_wall, plan_cpu, _, _ = timed(lambda: policy.plan(state, now.timestamp()))
    _, write_wall, write_cpu, _, writes = timed(lambda: queue_update(result.queue, jobs_by_id))
    plan_and_start(rows=rows)
    start_claimed()
    return {"cluster_state": (build_wall, build_cpu), "plan": (plan_wall, plan_cpu),
            "queue_update": (write_wall, write_cpu), "cluster_state_queries": build_queries,
            "queue_update_updates": writes, "waiting": len(result.queue), "never": sum(
                1 for e in result.queue if e.estimated_start is None)}


def pure_pass(state, now: float) -> tuple[float, float]:
    from apps.scheduling import policy

    _, wall, cpu, _, _ = timed(lambda: policy.plan(state, now))
    return wall, cpu


def ms(seconds: float) -> float:
    return rounded(1000 * seconds)


def measure(args, owners: list) -> dict:
    from django.utils import timezone

    from apps.scheduling.inputs import QueueRows, cluster_state
    from apps.scheduling.loop import plan_and_start

    heartbeat()
    now = timezone.now()
    base_state, _ = cluster_state(now)
    change = Change(owners)
    # The scheduler's own passes keep the queue's rows between them (QueueRows); --whole
    # reads the queue whole every pass, as one-off passes do (and every pass did before).
    rows = None if args.whole else QueueRows()
    if rows is not None:
        plan_and_start(rows=rows)  # the scheduler's first pass: reads the whole queue
        start_claimed()
    scenarios = {"steady": change.steady, "submit": change.submit, "finish": change.finish}
    out, pure = {}, []
    for name, fn in scenarios.items():
        lives, splits = [], []
        for _ in range(args.repeat):
            lives.append(live_pass(fn, rows))
            splits.append(split_pass(fn, rows))
            pure.append(pure_pass(base_state, now.timestamp()))
        parts = {part: {"wall_ms": ms(median([s[part][0] for s in splits])),
                        "cpu_ms": ms(median([s[part][1] for s in splits]))}
                 for part in ("cluster_state", "plan", "queue_update")}
        wall = median([p["wall"] for p in lives])
        parts["other"] = {"wall_ms": ms(wall - sum(median([s[p][0] for s in splits]) for p in parts)),
                          "cpu_ms": ms(median([p["cpu"] for p in lives])
                                       - sum(median([s[p][1] for s in splits]) for p in parts))}
        out[name] = {
            "wall_ms": ms(wall), "cpu_ms": ms(median([p["cpu"] for p in lives])),
            "queries": median([p["queries"] for p in lives]), "job_updates": median([p["updates"] for p in lives]),
            "starts": median([p["starts"] for p in lives]),
            "submitted_positions": [p["changed_position"] for p in lives] if name == "submit" else None,
            "passes": [{k: (ms(v) if k in ("wall", "cpu") else v) for k, v in p.items()} for p in lives],
            "split": parts,
            "split_cluster_state_queries": median([s["cluster_state_queries"] for s in splits]),
            "split_queue_update_updates": median([s["queue_update_updates"] for s in splits]),
            "waiting": splits[-1]["waiting"], "waiting_without_eta": splits[-1]["never"],
        }
    pure_wall, pure_cpu = median([w for w, _ in pure]), median([c for _, c in pure])
    for name in scenarios:
        out[name]["live_over_pure_wall"] = round(out[name]["wall_ms"] / ms(pure_wall), 1)
        out[name]["live_over_pure_cpu"] = round(out[name]["cpu_ms"] / ms(pure_cpu), 1)
    return {"scenarios": out, "pure_policy": {"wall_ms": ms(pure_wall), "cpu_ms": ms(pure_cpu),
                                              "passes": len(pure)}}


def run(args) -> dict:
    """One queue size, in this process (Django is set up once per process)."""
    size = int(args.queued)
    args.queued = size
    with Stack(f"live-{args.database}-{size}", args.database) as stack:
        stack.prepare()
        stack.django()
        started = time.monotonic()
        content, owners = fill(args)
        filled_s = time.monotonic() - started
        figures = measure(args, owners)
        from django.db import connection

        connection.close()  # before the stack drops its database
    return {"queued": size, "fill_s": round(filled_s, 1), "content": content, **figures}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--queued", default="1000,10000", help="comma-separated queue sizes, one database each")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--history", type=int, default=2000, help="finished jobs with usage records")
    parser.add_argument("--whole", action="store_true",
                        help="read the whole queue every pass (no QueueRows kept between passes)")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.queued.split(",") if s]

    load_start = [round(x, 2) for x in os.getloadavg()]
    if len(sizes) == 1:
        results = [run(args)]
    else:  # one process per size: Django is set up once per process, for one database
        results = []
        for size in sizes:
            with tempfile.NamedTemporaryFile(suffix=".json") as handle:
                subprocess.run([sys.executable, __file__, *(argv if argv is not None else sys.argv[1:]),
                                "--queued", str(size), "--json", handle.name], check=True, stdout=subprocess.DEVNULL)
                results += json.loads(Path(handle.name).read_text())["sizes"]
    result = {"machine": machine(), "load_average_start": load_start, "database": args.database,
              "repeat": args.repeat, "nodes": args.nodes, "gpus_per_node": args.gpus_per_node,
              "history": args.history, "sizes": results}
    for r in results:
        print(f"\n{args.database}, {r['queued']:,} queued, {r['content']['gpus']} GPUs "
              f"({r['content']['gpus_busy']:g} busy), jobs {r['content']['jobs_by_state']}; "
              f"pure policy on one state: {r['pure_policy']['wall_ms']} ms wall, {r['pure_policy']['cpu_ms']} ms CPU")
        print(f"{'scenario':9} {'wall ms':>9} {'CPU ms':>9} {'queries':>8} {'UPDATEs':>8} {'starts':>6} "
              f"{'live/pure':>9}   split wall ms: cluster_state / plan / queue_update / other")
        for name, s in r["scenarios"].items():
            parts = " / ".join(f"{s['split'][p]['wall_ms']}" for p in ("cluster_state", "plan", "queue_update",
                                                                       "other"))
            print(f"{name:9} {s['wall_ms']:>9} {s['cpu_ms']:>9} {s['queries']:>8g} {s['job_updates']:>8g} "
                  f"{s['starts']:>6g} {s['live_over_pure_wall']:>8}x   {parts}")
        print(f"the submitted urgent job's queue position after its pass: {r['scenarios']['submit']['submitted_positions']}"
              f"; queue entries without an ETA: {r['scenarios']['steady']['waiting_without_eta']} of "
              f"{r['scenarios']['steady']['waiting']}")
    print(f"load average {load_start} → {[round(x, 2) for x in os.getloadavg()]}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
