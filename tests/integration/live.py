"""The live system for integration tests: real scheduler and gpu_worker processes.

They run ``manage.py`` against the test database file and the session's Redis, with
short grace periods so faults show within seconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings

from yoloportal.env import database_url

BASE_DIR = Path(settings.BASE_DIR)
FAST_TIMINGS = {
    "SCHEDULER_TICK_S": "1",
    "HEARTBEAT_S": "1",
    "NODE_GRACE_S": "8",
    "DISPATCH_REPAIR_S": "4",
}


def fast_trainer(epoch_s: float) -> dict[str, str]:
    """A worker's environment for the fast trainer (worker/fast_child.py: the real event
    contract and checkpoint files, no torch), without the zygote's torch preload it never uses."""
    return {"YOLOPORTAL_FAST_TRAINER": "1", "FAST_TRAINER_EPOCH_S": str(epoch_s), "TRAINER_PRELOAD": "false"}


def wait_for(predicate, timeout: float, interval: float = 0.25, what: str = "condition", detail=None):
    """Poll ``predicate`` until it is true; fail after ``timeout`` naming ``what`` and, if given,
    what ``detail()`` says then (what was still open)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}" + (f"; {detail()}" if detail else ""))


def open_jobs(job_ids, limit: int = 5) -> str:
    """How many of ``job_ids`` are still open, and the first few: state, attempt, node, dispatch
    time, last events."""
    from apps.jobs.models import TERMINAL_STATES, Job, JobEvent

    still_open = Job.objects.filter(pk__in=job_ids).exclude(state__in=TERMINAL_STATES)
    rows = []
    for open_job in still_open[:limit]:
        events = list(JobEvent.objects.filter(job_id=open_job.pk).order_by("-seq")
                      .values_list("attempt", "kind", "message")[:4])
        rows.append(f"{open_job.pk} {open_job.state} attempt {open_job.attempt} on {open_job.node_id} "
                    f"dispatched {open_job.dispatched_at}: {events[::-1]}")
    return f"{still_open.count()} of {len(job_ids)} open: " + " | ".join(rows)


def wait_for_scheduler_passes(after: float, passes: int = 1, timeout: float = 60) -> None:
    """Wait until ``passes`` whole scheduler passes began after ``after`` (``time.time()``) and ended.

    Each pass records its end time (apps.monitoring.recorders, for /metrics). A pass that ended
    after ``after`` may have begun before it; the next one began after that end: so ``passes + 1``
    distinct ends later than ``after`` are needed (one leader's passes run one after another)."""
    from apps.core.redis_client import redis_client
    from apps.monitoring.recorders import last_pass_time

    ends: set[float] = set()

    def seen() -> bool:
        end = last_pass_time(redis_client())
        if end is not None and end > after:
            ends.add(end)
        return len(ends) > passes

    wait_for(seen, timeout, interval=0.05, what=f"{passes} scheduler pass(es) after the moment in question")


class LiveSystem:
    def __init__(self, log_dir: Path, redis_url: str) -> None:
        self.log_dir = log_dir
        self.redis_url = redis_url
        self.processes: dict[str, subprocess.Popen] = {}

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(FAST_TIMINGS)
        env.update({
            "DATABASE_URL": database_url(settings.DATABASES["default"]),
            "REDIS_URL": self.redis_url,
            "DATA_DIR": str(settings.DATA_DIR),
            "PYTHONUNBUFFERED": "1",
            "DJANGO_SETTINGS_MODULE": "yoloportal.settings",
        })
        env.update(extra)
        return env

    def start(self, name: str, *args: str, **env: str) -> subprocess.Popen:
        log = open(self.log_dir / f"{name}.log", "ab")
        process = subprocess.Popen(
            [sys.executable, "manage.py", *args], cwd=BASE_DIR, env=self.env(**env),
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        self.processes[name] = process
        return process

    def start_scheduler(self, name: str = "scheduler", **env: str) -> subprocess.Popen:
        return self.start(name, "scheduler", **env)

    def start_worker(self, name: str = "worker", node: str = "node-a", gpus: int = 1, **env: str) -> subprocess.Popen:
        return self.start(name, "gpu_worker", "--name", node, "--simulate-gpus", str(gpus), **env)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Kill the process's whole group (a worker's work-horse is in it; training is not)."""
        process = self.processes.pop(name)
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            pass
        process.wait(30)

    def log(self, name: str) -> str:
        path = self.log_dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop_all(self) -> None:
        for name in list(self.processes):
            self.kill(name, signal.SIGKILL)


def training_processes(jobs_dir: Path | None = None) -> dict[str, list[int]]:
    """Live training children by job id (read from their command lines via the config path).

    Only training under ``jobs_dir`` (default: this test's ``JOBS_DIR``) is counted: a worker
    started with its own ``DATA_DIR`` trains under that folder's ``jobs/``, so pass it."""
    jobs_dir = Path(jobs_dir or settings.JOBS_DIR)
    found: dict[str, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            words = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").split()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        # A plain subprocess or a child forked by the zygote (which retitles itself).
        if state == "Z" or not {"worker.train_child", "worker.fast_child"} & set(words):
            continue
        configs = [w for w in words if w.endswith(".json")]
        if not configs:
            continue
        config = Path(configs[-1])
        if not config.is_relative_to(jobs_dir):
            continue  # another test run's (or `make run`'s) training
        job_id = config.parent.parent.name  # JOBS_DIR/<job id>/attempt-N/config-K.json
        found.setdefault(job_id, []).append(int(entry.name))
    return found


class InvariantWatch:
    """Samples, while faults happen, that no GPU is over-allocated and no job trains twice."""

    def __init__(self, interval: float = 0.2) -> None:
        import threading

        self.interval = interval
        self.violations: list[str] = []
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> InvariantWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        from django.db import connection

        try:
            while not self._stop.wait(self.interval):
                self.violations += allocation_violations()
                for job_id, pids in training_processes().items():
                    if len(pids) > 1:
                        self.violations.append(f"job {job_id} trains in {len(pids)} processes {pids}")
                self.samples += 1
        finally:
            connection.close()


def allocation_violations() -> list[str]:
    """What the database says is allocated, checked three ways (each one SQL statement, so
    each is a consistent snapshot even while schedulers and workers write):

    1. no GPU's shares add up to more than one GPU (the jobs' own view);
    2. every GPU slot row belongs to a starting/running job's current attempt (no slot is
       held by an attempt that ended, so none is held by two attempts over time);
    3. every starting/running job holds exactly the slots its share needs.
    """
    from django.db.models import Count, F, Q

    from apps.jobs.models import HOLDING_STATES, GpuSlot, Job
    from apps.jobs.services import slots_needed

    found = []
    shares: dict[tuple[int, int], float] = {}
    for node_id, indices, share in Job.objects.filter(state__in=HOLDING_STATES).values_list(
            "node_id", "gpu_indices", "gpu_share"):
        for index in indices or []:
            shares[(node_id, index)] = shares.get((node_id, index), 0.0) + share
    found += [f"GPU {key} allocated {total:g}" for key, total in shares.items() if total > 1.0 + 1e-9]
    for node_id, index, slot, job_id, state in GpuSlot.objects.exclude(
            job__state__in=HOLDING_STATES, attempt_id=F("job__attempt_id")).values_list(
            "node_id", "gpu_index", "slot", "job_id", "job__state"):
        found.append(f"slot {node_id}:{index}/{slot} still held by job {job_id} ({state}, old attempt)")
    holding = (Job.objects.filter(state__in=HOLDING_STATES)
               .annotate(held=Count("gpu_slots", filter=Q(gpu_slots__attempt_id=F("attempt_id"))))
               .values_list("pk", "gpu_indices", "gpu_share", "held"))
    for job_id, indices, share, held in holding:
        if held != len(indices or []) * slots_needed(share):
            found.append(f"job {job_id} holds {held} slots for GPU {indices} × {share:g}")
    return found
