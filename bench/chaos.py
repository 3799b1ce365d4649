"""A chaos run: a whole stack under random crashes, invariants checked throughout.

    nice python bench/chaos.py --minutes 12 --seed 1 [--database sqlite|postgres] [--json out.json]

A throwaway stack (common.Stack: its own DATA_DIR, SQLite file or PostgreSQL database, and
embedded Redis with AOF) runs the web server, two ``manage.py scheduler`` processes and three
``manage.py gpu_worker`` processes (two simulated GPUs each, the fast trainer of
worker/fast_child.py). Three users of two teams submit a steady stream of jobs of mixed
shapes (1/8 to 2 GPUs), priority classes and retries through the API. For ``--minutes`` the
run, driven by ``random.Random(seed)``, does one fault every few seconds:

- ``worker``: SIGKILL a worker's process group, start it again (same node) 1-20 s later;
- ``child``: SIGKILL one training child;
- ``leader``: SIGKILL the scheduler holding the leader lease, start it again 1-10 s later;
- ``redis``: SIGKILL Redis, start it again on the same port and AOF 1-6 s later;
- ``pause``: SIGSTOP a worker (its process group, or its main process only) past the
  node grace, then SIGCONT it;
- ``cancel``: a user cancels one of their active jobs (a legitimate end, through the API).

A watcher samples the database every second (tests/integration/live.py's
``allocation_violations``: no GPU slot held twice or by an attempt that ended, every holding
job holding exactly its slots), no job training in two processes (except while a whole
worker is paused: a partition, a documented limit), and no job holding GPUs with a silent
owner far beyond the grace periods. Then the faults stop, everything is brought back and
the run waits for every job to end. The final checks: every accepted job is in the database
and terminal; no failure that our own crash caused (a ``MAX_LOST_ATTEMPTS`` failure only
where that many attempts really were lost); one usage record per started attempt and none
for others; each attempt ran once; events in sequence, one terminal event, last; a
succeeded job's metrics one per epoch, 1..epochs; no GPU slot left. It prints a summary
and exits 1 if anything was violated. Not a CI test: it runs minutes and is random.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from common import Stack, http_post_json

FAST_TIMINGS = {"SCHEDULER_TICK_S": "1", "HEARTBEAT_S": "1", "NODE_GRACE_S": "8", "DISPATCH_REPAIR_S": "4"}
GRACE_S = float(FAST_TIMINGS["NODE_GRACE_S"])
NODES = ("node-a", "node-b", "node-c")
SCHEDULERS = ("scheduler-a", "scheduler-b")
USERS = (("alice", "vision"), ("bob", "vision"), ("carol", "robotics"))
SHARES = (1, 1, 0.5, 0.25, 0.125, 2)
PRIORITIES = ("low", "low", "medium", "medium", "high", "urgent")
FAULTS = {"worker": 3, "child": 4, "leader": 2, "redis": 1, "pause": 1, "cancel": 1}
TERMINAL = ("succeeded", "failed", "cancelled", "timed_out")
# How long a holding job may go without a sign of its owner before the watcher calls it stuck:
# the grace, a lapsed leader lease (12 s) and a restart, on a loaded two-core machine.
STUCK_S = GRACE_S + 12 + 40


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", flush=True)


class Chaos:
    def __init__(self, stack: Stack, seed: int, epoch_s: float) -> None:
        self.stack = stack
        self.rng = random.Random(seed)
        self.worker_env = {**FAST_TIMINGS, "YOLOPORTAL_FAST_TRAINER": "1", "FAST_TRAINER_EPOCH_S": str(epoch_s),
                           "TRAINER_PRELOAD": "false", "LOG_LEVEL": "INFO"}
        self.tokens: dict[str, str] = {}
        self.base = ""
        self.accepted: dict[str, dict] = {}  # job id -> what was asked
        self.refused: list[str] = []
        self.kills: collections.Counter[str] = collections.Counter()
        self.violations: list[str] = []
        self.notes: list[str] = []
        self.samples = 0
        self.paused_groups: set[str] = set()  # workers whose whole group is stopped now
        self.lock = threading.Lock()
        self.stop_submitting = threading.Event()
        self.stop_watching = threading.Event()
        self.seen_violations: set[str] = set()

    # --- processes ---------------------------------------------------------------------------

    def start_worker(self, node: str) -> None:
        self.stack.start_worker(gpus=2, name=node, **self.worker_env)

    def start_scheduler(self, name: str) -> None:
        self.stack.start(name, [sys.executable, "manage.py", "scheduler"], **FAST_TIMINGS, LOG_LEVEL="INFO")

    def alive(self, name: str) -> bool:
        process = self.stack.processes.get(name)
        return process is not None and process.poll() is None

    def kill_group(self, name: str) -> None:
        process = self.stack.processes.pop(name)
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(30)

    def later(self, delay: float, action, *args) -> None:
        timer = threading.Timer(delay, self.guarded, (action, *args))
        timer.daemon = True
        timer.start()

    def guarded(self, action, *args) -> None:
        try:
            action(*args)
        except Exception as exc:  # noqa: BLE001 - a fault's follow-up must not end the run
            self.notes.append(f"{action.__name__}{args}: {exc!r}")

    # --- faults ------------------------------------------------------------------------------

    def fault_worker(self) -> bool:
        node = self.rng.choice([n for n in NODES if self.alive(f"worker-{n}") and n not in self.paused_groups]
                               or [None])
        if node is None:
            return False
        self.kill_group(f"worker-{node}")
        delay = self.rng.uniform(1, 20)
        log(f"fault: SIGKILL worker {node} (back in {delay:.0f} s)")
        self.later(delay, self.start_worker, node)
        return True

    def fault_child(self) -> bool:
        from tests.integration.live import training_processes

        found = training_processes(self.stack.dir / "jobs")
        if not found:
            return False
        job_id = self.rng.choice(sorted(found))
        try:
            os.kill(found[job_id][0], signal.SIGKILL)
        except ProcessLookupError:
            return False
        log(f"fault: SIGKILL training child of {job_id}")
        return True

    def leader_pid(self) -> int | None:
        import redis

        from apps.scheduling.leader import LEASE_KEY

        try:
            raw = redis.Redis.from_url(self.stack.redis.url, socket_timeout=2).get(LEASE_KEY)
        except redis.RedisError:
            return None
        return int(raw.decode().split("#")[0].rsplit(":", 1)[1]) if raw else None

    def fault_leader(self) -> bool:
        pid = self.leader_pid()
        name = next((n for n in SCHEDULERS if self.alive(n) and self.stack.processes[n].pid == pid), None)
        if name is None:
            return False
        self.kill_group(name)
        delay = self.rng.uniform(1, 10)
        log(f"fault: SIGKILL leader {name} (pid {pid}; back in {delay:.0f} s)")
        self.later(delay, self.start_scheduler, name)
        return True

    def fault_redis(self) -> bool:
        if self.stack.redis.process is None or self.stack.redis.process.poll() is not None:
            return False
        self.stack.redis.kill()
        delay = self.rng.uniform(1, 6)
        log(f"fault: SIGKILL Redis (back in {delay:.0f} s, same port and AOF)")
        self.later(delay, self.stack.redis.start)
        return True

    def fault_pause(self) -> bool:
        node = self.rng.choice([n for n in NODES if self.alive(f"worker-{n}") and n not in self.paused_groups]
                               or [None])
        if node is None:
            return False
        process = self.stack.processes[f"worker-{node}"]
        whole = self.rng.random() < 0.5
        pause = GRACE_S + self.rng.uniform(2, 10)
        if whole:
            self.paused_groups.add(node)
            os.killpg(process.pid, signal.SIGSTOP)
        else:
            os.kill(process.pid, signal.SIGSTOP)
        log(f"fault: SIGSTOP worker {node} ({'process group' if whole else 'main process'}) for {pause:.0f} s")
        self.later(pause, self.resume, node, process, whole)
        return True

    def resume(self, node: str, process: subprocess.Popen, whole: bool) -> None:
        try:
            (os.killpg if whole else os.kill)(process.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        log(f"SIGCONT worker {node}")
        if whole:
            # Its stale children get a few seconds to notice they were fenced off.
            self.later(2 * GRACE_S, self.paused_groups.discard, node)

    def fault_cancel(self) -> bool:
        from apps.jobs.models import ACTIVE_STATES, Job

        active = list(Job.objects.filter(pk__in=list(self.accepted), state__in=ACTIVE_STATES)
                      .values_list("pk", "user__username")[:200])
        if not active:
            return False
        job_id, username = self.rng.choice(active)
        status, body = http_post_json(f"{self.base}/api/v1/jobs/{job_id}/cancel/", self.tokens[username], {})
        log(f"fault: {username} cancels {job_id}: {status}")
        return True

    # --- load --------------------------------------------------------------------------------

    def spec(self, n: int) -> tuple[str, dict]:
        username, team = self.rng.choice(USERS)
        epochs = self.rng.randint(2, 12)
        spec = {"task_name": f"chaos-{n}", "team": team, "allow_duplicate": True,
                "command": f"yolo train data=demo model=yolov8n.yaml epochs={epochs} imgsz=64",
                "resources": {"gpu": self.rng.choice(SHARES)}, "priority": self.rng.choice(PRIORITIES),
                "retries": self.rng.choice((0, 0, 1, 2)), "timeout": 3600}
        return username, spec

    def submit_loop(self, rate_s: float) -> None:
        n = 0
        while not self.stop_submitting.wait(self.rng.expovariate(1 / rate_s)):
            n += 1
            username, spec = self.spec(n)
            try:
                status, body = http_post_json(self.base + "/api/v1/jobs/", self.tokens[username], spec, timeout=60)
            except OSError as exc:
                self.refused.append(f"{spec['task_name']}: {exc!r}")
                continue
            if status == 201:
                self.accepted[body["id"]] = {"user": username, **spec}
            else:
                self.refused.append(f"{spec['task_name']}: {status} {str(body)[:200]}")

    # --- invariants --------------------------------------------------------------------------

    def violation(self, key: str, text: str) -> None:
        if key not in self.seen_violations:
            self.seen_violations.add(key)
            self.violations.append(f"{time.strftime('%H:%M:%S')} {text}")
            log(f"VIOLATION {text}")

    def watch(self) -> None:
        from django.db import connection
        from django.utils import timezone

        from apps.jobs.models import Job
        from tests.integration.live import allocation_violations, training_processes

        try:
            while not self.stop_watching.wait(1.0):
                for text in allocation_violations():
                    self.violation(text, text)
                paused_nodes = set(self.paused_groups)
                for job_id, pids in training_processes(self.stack.dir / "jobs").items():
                    if len(pids) > 1:
                        text = f"job {job_id} trains in {len(pids)} processes {pids}"
                        if paused_nodes:
                            self.notes.append(f"(while {sorted(paused_nodes)} paused, a known limit) {text}")
                        else:
                            self.violation(f"twice {job_id}", text)
                now = timezone.now()
                for job_id, state, attempt, node, beat, dispatched in Job.objects.filter(
                        state__in=("starting", "running")).values_list(
                        "pk", "state", "attempt", "node__name", "heartbeat_at", "dispatched_at"):
                    since = beat or dispatched
                    if since is not None and (now - since).total_seconds() > STUCK_S:
                        self.violation(f"stuck {job_id} {attempt}",
                                       f"job {job_id} {state} attempt {attempt} on {node}: no sign of its owner "
                                       f"for {(now - since).total_seconds():.0f} s")
                self.samples += 1
        finally:
            connection.close()

    # --- the run -----------------------------------------------------------------------------

    def run(self, minutes: float, rate_s: float) -> dict:
        stack = self.stack
        log(f"stack in {stack.dir}")
        stack.prepare()
        for username, _ in USERS:
            self.tokens[username] = stack.manage("issue_token", username).strip()
        self.base = stack.start_web(workers=1)
        stack.django()
        for node in NODES:
            self.start_worker(node)
        for name in SCHEDULERS:
            self.start_scheduler(name)
        from apps.cluster.models import Node

        wait(lambda: Node.objects.count() == len(NODES), 120, "the workers to register")
        threading.Thread(target=self.watch, daemon=True).start()
        threading.Thread(target=self.submit_loop, args=(rate_s,), daemon=True).start()
        started = time.monotonic()
        kinds, weights = zip(*FAULTS.items(), strict=True)
        while time.monotonic() - started < minutes * 60:
            time.sleep(self.rng.uniform(2, 10))
            kind = self.rng.choices(kinds, weights)[0]
            try:
                if getattr(self, f"fault_{kind}")():
                    self.kills[kind] += 1
            except Exception as exc:  # noqa: BLE001
                self.notes.append(f"fault {kind}: {exc!r}")
        self.stop_submitting.set()
        log(f"faults over after {minutes:g} min; {len(self.accepted)} jobs accepted; draining")
        drain_started = time.monotonic()
        time.sleep(25)  # pending restarts and SIGCONTs fire
        self.restore()
        drained = self.drain()
        drain_s = time.monotonic() - drain_started
        self.stop_watching.set()
        time.sleep(1.5)
        return self.summary(drained, drain_s)

    def restore(self) -> None:
        if self.stack.redis.process is None or self.stack.redis.process.poll() is not None:
            self.stack.redis.start()
        for node in NODES:
            process = self.stack.processes.get(f"worker-{node}")
            if process is not None:
                try:
                    os.killpg(process.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            if not self.alive(f"worker-{node}"):
                self.stack.processes.pop(f"worker-{node}", None)
                self.start_worker(node)
        for name in SCHEDULERS:
            if not self.alive(name):
                self.stack.processes.pop(name, None)
                self.start_scheduler(name)

    def drain(self, stall_s: float = 180) -> bool:
        from apps.jobs.models import Job

        done, last_change = -1, time.monotonic()
        while True:
            now_done = Job.objects.filter(pk__in=list(self.accepted), state__in=TERMINAL).count()
            if now_done == len(self.accepted):
                return True
            if now_done != done:
                done, last_change = now_done, time.monotonic()
            elif time.monotonic() - last_change > stall_s:
                log(f"drain stalled: {done} of {len(self.accepted)} terminal, none for {stall_s:.0f} s")
                return False
            time.sleep(2)

    def summary(self, drained: bool, drain_s: float) -> dict:
        from apps.jobs.models import GpuSlot, Job

        problems = final_checks(list(self.accepted))
        jobs = Job.objects.filter(pk__in=list(self.accepted))
        states = collections.Counter(jobs.values_list("state", flat=True))
        errors = collections.Counter(
            shorten(e) for e in jobs.filter(state="failed").values_list("error", flat=True))
        attempts = collections.Counter(jobs.values_list("attempt", flat=True))
        return {
            "jobs": len(self.accepted), "refused": self.refused[:20], "refused_count": len(self.refused),
            "states": dict(states), "attempts": dict(sorted(attempts.items())),
            "failure_reasons": dict(errors), "faults": dict(self.kills), "invariant_samples": self.samples,
            "violations": self.violations, "final_problems": problems, "drained": drained,
            "drain_s": round(drain_s, 1), "gpu_slots_left": GpuSlot.objects.count(),
            "notes": self.notes[:50], "stack_dir": str(self.stack.dir),
        }


def shorten(error: str) -> str:
    import re

    return re.sub(r"[0-9a-f-]{36}|\d+(\.\d+)?", "#", error)[:160]


# A fenced attempt's own wrap-up, recorded against its number after a newer attempt's events by
# design (jobs.services.attempt_finish, worker.tasks.AttemptRunner.report_usage).
WRAP_UP = {"attempt_stopped", "attempt_resources"}


def final_checks(job_ids: list[str]) -> list[str]:
    """What must hold once every job ended (see the module docstring); read from the database only."""
    from apps.jobs.models import TERMINAL_STATES, Checkpoint, Job, JobEvent, MetricPoint
    from apps.quotas.models import UsageRecord

    problems = []
    found = set(str(pk) for pk in Job.objects.filter(pk__in=job_ids).values_list("pk", flat=True))
    problems += [f"job {job_id} accepted but not in the database" for job_id in set(job_ids) - found]
    for job in Job.objects.filter(pk__in=job_ids):
        job_id = str(job.pk)
        events = list(JobEvent.objects.filter(job_id=job.pk).order_by("seq").values_list(
            "seq", "attempt", "kind", "message", "data"))
        seqs = [e[0] for e in events]
        if job.state not in TERMINAL_STATES:
            problems.append(f"job {job_id} ended the run {job.state} (attempt {job.attempt})")
            continue
        if len(set(seqs)) != len(seqs):
            problems.append(f"job {job_id}: duplicate event seqs")
        terminal = [e for e in events if e[2] in TERMINAL]
        last = [e for e in events if e[2] not in WRAP_UP][-1]
        if len(terminal) != 1 or last[2] not in TERMINAL:
            problems.append(f"job {job_id}: terminal events {[(e[1], e[2]) for e in terminal]}, last {last[1:3]}")
        newest = 0
        for seq, attempt, kind, message, _ in events:
            if attempt < newest and kind not in WRAP_UP:
                problems.append(f"job {job_id}: attempt {attempt} recorded {kind!r} after attempt {newest}'s "
                                f"events (seq {seq}: {message[:80]})")
            newest = max(newest, attempt)
        ran = [e[1] for e in events if e[2] == "running"]
        if len(ran) != len(set(ran)):
            problems.append(f"job {job_id}: an attempt ran twice {ran}")
        if ran and ran != list(range(1, len(ran) + 1)):
            problems.append(f"job {job_id}: started attempts {ran}, not 1..{len(ran)}")
        charged = sorted(UsageRecord.objects.filter(job_id=job.pk).values_list("attempt", flat=True))
        if charged != sorted(set(ran)):
            problems.append(f"job {job_id} ({job.state}): usage charged for attempts {charged}, started {ran}")
        if job.state == "succeeded":
            epochs = int(job.spec["train_args"]["epochs"])
            points = dict(MetricPoint.objects.filter(job_id=job.pk).values_list("epoch", "attempt"))
            if sorted(points) != list(range(1, epochs + 1)):
                problems.append(f"job {job_id}: metrics for epochs {sorted(points)}, trained {epochs}")
            final = [e for e in events if e[2] == "training_started" and e[1] == job.attempt]
            if final:
                first = int(final[-1][4].get("start_epoch") or 1)
                stale = {epoch: attempt for epoch, attempt in points.items() if epoch >= first and attempt != job.attempt}
                stale.update({f"checkpoint {epoch}": attempt for epoch, attempt in Checkpoint.objects.filter(
                    job_id=job.pk, epoch__gte=first).exclude(attempt=job.attempt).values_list("epoch", "attempt")})
                if stale:
                    problems.append(f"job {job_id}: attempt {job.attempt} trained epochs {first}..{epochs}, but these "
                                    f"rows are an older attempt's: {stale}")
        if job.state == "failed":
            lost = sum(1 for e in events if e[2] == "node_lost" and (e[4] or {}).get("attempt_started"))
            if "MAX_LOST_ATTEMPTS" in job.error:
                if lost + 1 < 5:  # the last lost attempt fails the job rather than requeue it
                    problems.append(f"job {job_id} failed as lost after only {lost} node_lost events: {job.error}")
            else:
                problems.append(f"job {job_id} failed: {job.error[:300]}")
        if job.state == "cancelled" and job.cancel_requested_at is None:
            problems.append(f"job {job_id} cancelled, though nobody cancelled it: {events[-3:]}")
    return problems


def recheck(folder: Path) -> int:
    """The final checks again, on a stack kept with ``--keep`` (every job in its database)."""
    os.environ.update({"DATABASE_URL": f"sqlite:///{folder / 'yoloportal.sqlite3'}", "DATA_DIR": str(folder),
                       "DJANGO_SETTINGS_MODULE": "yoloportal.settings", "REDIS_URL": "redis://127.0.0.1:1/0"})
    import django

    django.setup()
    from apps.jobs.models import Job

    problems = final_checks([str(pk) for pk in Job.objects.values_list("pk", flat=True)])
    print("\n".join(problems) or "no problems")
    return 1 if problems else 0


def wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise RuntimeError(f"timed out waiting for {what}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--database", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--rate-s", type=float, default=2.0, help="mean seconds between submits")
    parser.add_argument("--epoch-s", type=float, default=0.5, help="the fast trainer's seconds per epoch")
    parser.add_argument("--json", type=Path, help="write the summary here too")
    parser.add_argument("--keep", action="store_true", help="keep the stack's folder (logs) afterwards")
    parser.add_argument("--recheck", type=Path, metavar="FOLDER", help="only the final checks, on a kept stack")
    args = parser.parse_args()
    if args.recheck:
        return recheck(args.recheck)
    stack = Stack(f"chaos-{args.seed}-{uuid.uuid4().hex[:4]}", database=args.database)
    stack.env["LOG_LEVEL"] = "INFO"
    try:
        summary = Chaos(stack, args.seed, args.epoch_s).run(args.minutes, args.rate_s)
    finally:
        if args.keep:
            stack.dir = Path(stack.dir)
            keep = stack.dir
            stack.dir = Path("/nonexistent-chaos-keep")  # Stack.stop removes its folder
            stack.pg_admin_url = None  # and drops its PostgreSQL database
            stack.stop()
            log(f"logs kept in {keep}")
        else:
            stack.stop()
    summary.update(seed=args.seed, minutes=args.minutes, database=args.database)
    print(json.dumps(summary, indent=2, default=str))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2, default=str))
    return 1 if summary["violations"] or summary["final_problems"] or not summary["drained"] else 0


if __name__ == "__main__":
    sys.exit(main())
