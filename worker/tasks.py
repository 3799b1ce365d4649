"""The RQ job function that runs one attempt of a training job on this node.

It runs in RQ's forked work-horse. The training itself runs in a child process
(``worker.train_child``) in its own process group, so cancel and timeout can kill the
whole tree; the child also gets SIGKILL if this monitor dies (``PR_SET_PDEATHSIG``),
so a dead worker never leaves training running on a GPU the scheduler thinks is free.

It only executes and reports: every change to the job (start, check-in, checkpoints,
metrics, logs, the outcome) goes through ``apps.jobs.services``; no Job field is written here.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.db import close_old_connections
from django.db.models import Sum

from apps.core.artifacts import artifact_path
from apps.core.hashing import file_sha256
from apps.core.storage import shared_filesystem
from apps.jobs import live
from apps.jobs.models import Checkpoint, Job, JobState
from apps.jobs.paths import traceback_strip
from apps.jobs.services import (
    attempt_check_in,
    attempt_finish,
    attempt_heartbeat,
    attempt_start,
    checkpoint_record,
    checkpoint_reject,
    job_event,
    log_append,
    log_full,
    metrics_record,
)
from apps.monitoring import recorders
from apps.quotas.models import UsageRecord
from apps.scheduling.kick import kick_scheduler
from yoloportal.logs import bind

from .artifacts import dataset_local, results_upload, weights_local, with_storage
from .gpulock import GpuLocks, lock_dir
from .train_child import EXIT_CHECKPOINT  # exit codes are the child's contract: defined there only
from .zygote import ZygoteChild

log = logging.getLogger("yoloportal.worker")

KILL_GRACE_S = 5.0
POLL_S = 0.25
LOG_FLUSH_S = 1.0
GPU_WAIT_S = 60.0
# How long a horse whose training was killed by a signal it did not send waits to see
# whether its own worker is dying too (then the node's loss, not the kill, is reported).
WORKER_SETTLE_S = 1.0
# Once a job's stored log is full, its output file is emptied whenever it grows past this.
LOG_FILE_KEEP_BYTES = 1 << 20


# What the training child (and the zygote it may be forked from) inherits of the worker's
# environment: an allow-list, so SECRET_KEY, DATABASE_URL, REDIS_URL, cloud credentials and
# whatever else the worker was given stay out of reach of training code (docs/security.md).
TRAINER_ENV_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP", "VIRTUAL_ENV",
    "PYTHONPATH", "LD_LIBRARY_PATH", "SSL_CERT_FILE", "SSL_CERT_DIR",
})
TRAINER_ENV_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "NCCL_", "OMP_", "KMP_", "MKL_", "OPENBLAS_", "NUMEXPR_")


def trainer_environment() -> dict[str, str]:
    """The allow-listed part of this process's environment, for training processes."""
    return {key: value for key, value in os.environ.items()
            if key in TRAINER_ENV_NAMES or key.startswith(TRAINER_ENV_PREFIXES)}


def run_attempt(job_id: str, attempt_id: str) -> str:
    """Entry point RQ calls with ids only. Returns a short outcome word for RQ's result."""
    # The work-horse dies with the worker that forked it (and the training child with the
    # horse), so "the worker died" always means the whole tree is gone and the node's
    # silence, not a half-alive orphan, decides what happens to the job.
    set_parent_death_signal()
    if os.getppid() == 1:
        return "orphaned"
    close_old_connections()
    node_name = os.environ.get("YOLOPORTAL_NODE", "")
    # The work-horse runs one attempt and exits: every log line from here on carries it.
    bind(job_id=job_id, node=node_name)
    # Fenced start: only the current attempt, on the node it was given to, moves to running.
    job = attempt_start(job_id=job_id, attempt_id=attempt_id, node_name=node_name)
    if job is None:
        log.warning("refusing job %s attempt %s: no longer the current attempt for node %s",
                    job_id, attempt_id, node_name)
        return "refused"
    bind(attempt=job.attempt)
    try:
        return AttemptRunner(job).run()
    finally:
        kick_scheduler()


def set_parent_death_signal() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except OSError:
        pass


@dataclass
class ChildResult:
    exit_code: int | None = None
    outcome: str = ""  # succeeded | failed | cancelled | timed_out | fenced | checkpoint_unusable | killed
    finished: dict | None = None
    error: dict | None = None
    log_tail: list[str] = field(default_factory=list)


class AttemptRunner:
    def __init__(self, job: Job) -> None:
        self.job = job
        self.worker_pid = os.getppid()  # the RQ worker (slot) that forked this work-horse
        self.run_dir = Path(job.run_dir)
        self.attempt_dir = self.run_dir / f"attempt-{job.attempt}"
        self.checkpoint_dir = self.run_dir / "checkpoints"
        for folder in (self.attempt_dir, self.checkpoint_dir):
            folder.mkdir(parents=True, exist_ok=True)
        self.log_path = self.attempt_dir / "output.log"
        self.log_tail: list[str] = []
        self.previous_runtime_s = self._previous_runtime()
        self.local: dict[str, str] = {}  # artifact key → this node's file (worker/artifacts.py)

    def _previous_runtime(self) -> float:
        gpu_seconds = UsageRecord.objects.filter(job=self.job).aggregate(s=Sum("gpu_seconds"))["s"] or 0.0
        return gpu_seconds / max(self.job.gpus, 1e-9)

    # --- checkpoints -----------------------------------------------------------------------

    def verified_checkpoints(self) -> list[Checkpoint]:
        """Newest first; a file that is missing or fails its checksum is dropped with an event."""
        good = []
        for ckpt in Checkpoint.objects.filter(job=self.job).order_by("-epoch", "-created_at"):
            path = Path(ckpt.path)
            if path.is_file() and path.stat().st_size == ckpt.size and file_sha256(path) == ckpt.sha256:
                good.append(ckpt)
                continue
            checkpoint_reject(self.job, ckpt, message=f"checkpoint of epoch {ckpt.epoch} is missing or corrupt; "
                                                      f"falling back to an older one")
        return good

    # --- the attempt --------------------------------------------------------------------------

    def run(self) -> str:
        """Wait until the GPUs are ours, then try the newest verified checkpoint, older ones, scratch."""
        locks = GpuLocks(lock_dir(self.job.node.name, settings.DATA_DIR), list(self.job.gpu_indices),
                         exclusive=self.job.gpu_share >= 1.0)
        try:
            stop = self.wait_for_gpus(locks)
            if stop:
                return self.finish(ChildResult(outcome=stop))
            return self.train()
        finally:
            locks.release()

    def wait_for_gpus(self, locks: GpuLocks) -> str:
        """Block until the previous attempts on our GPUs have stopped; '' or why to stop instead."""
        deadline = time.monotonic() + GPU_WAIT_S
        waited = False
        while not locks.try_acquire():
            if time.monotonic() > deadline:
                job_event(self.job, "gpus_busy", f"GPU {','.join(map(str, self.job.gpu_indices))} still held by "
                                                  f"another process after {GPU_WAIT_S:.0f} s; starting anyway")
                return ""
            if not waited:
                log.info("job %s waits for GPU %s to be released", self.job.pk, self.job.gpu_indices)
                waited = True
            stop = self.check_in()
            if stop:
                return stop
            time.sleep(0.5)
        return ""

    def stage_inputs(self) -> str:
        """This node's files for the job's dataset and weights ('' or why to stop): in place on a
        shared filesystem, else fetched from the artifact store (waiting while it is down)."""
        if shared_filesystem():
            return ""
        spec = self.job.spec
        resolved, inputs = spec["resolved"], spec.get("inputs") or {}
        source = resolved.get("source") or {}
        wanted = []
        for yaml_key in {resolved.get("data_yaml"), source.get("data_yaml")} - {None, ""}:
            if not yaml_key.startswith("/"):
                sha = ((inputs.get("source") if yaml_key == source.get("data_yaml") else None) or inputs.get("data")
                       or {}).get("sha256") or ""
                wanted.append((yaml_key, lambda k=yaml_key, h=sha: dataset_local(k, h)))
        folder = source.get("folder_key")
        if folder:
            sha = (inputs.get("source") or {}).get("sha256") or ""
            marker = folder + "/.folder"  # the folder itself: fetched as a dataset without a data.yaml
            wanted.append((folder, lambda k=marker, h=sha: dataset_local(k, h).parent))
        model = resolved.get("model")
        if isinstance(model, dict) and model.get("key"):
            wanted.append((model["key"], lambda k=model["key"], h=model.get("sha256") or "": weights_local(k, h)))
        for key, fetch in wanted:
            path, stop = with_storage(self.job, f"fetching {key}", fetch, self.check_in)
            if stop:
                return stop
            self.local[key] = str(path)
        return ""

    def train(self) -> str:
        stop = self.stage_inputs()
        if stop:
            return self.finish(ChildResult(outcome=stop))
        # Only training resumes from checkpoints; val, predict and export start over.
        resumable = self.job.spec.get("mode", "train") == "train"
        candidates: list[Checkpoint | None] = [*(self.verified_checkpoints() if resumable else []), None]
        result = ChildResult()
        for number, checkpoint in enumerate(candidates, start=1):
            if checkpoint is not None:
                job_event(self.job, "resuming", f"resuming from the checkpoint of epoch {checkpoint.epoch}")
            result = self.run_child(number, checkpoint)
            if result.outcome != "checkpoint_unusable":
                break
            checkpoint_reject(self.job, checkpoint, message=f"Ultralytics could not load the checkpoint of epoch "
                                                            f"{checkpoint.epoch}; trying an older one")
        # The training tree is gone: its GPUs are free from here (dispatch latency starts).
        # A job already placed on them (starting) waits for our lock, so it counts as waiting.
        recorders.gpus_freed(self.job.node.name, self.job.gpu_indices, jobs_waiting=Job.objects.filter(
            state__in=[JobState.QUEUED, JobState.STARTING]).exclude(pk=self.job.pk).exists())
        return self.finish(result)

    def child_config(self, number: int, checkpoint: Checkpoint | None) -> Path:
        spec = self.job.spec
        resolved = spec["resolved"]
        mode = spec.get("mode", "train")
        args = dict(spec.get("train_args") or {})
        for key in ("data", "model", "source", "split", "format", "half", "int8", "dynamic", "simplify", "opset"):
            args.pop(key, None)
        if mode == "export":
            args = {}  # all of them are the export entry's options
        if self.job.node.simulated and mode in ("train", "val"):
            args.setdefault("workers", 0)  # CPU-only: dataloader processes only compete for cores
        device = "cpu" if self.job.node.simulated else ",".join(str(i) for i in range(len(self.job.gpu_indices)))
        model, model_sha256 = resolved_model(resolved, self.local)
        source = resolved.get("source") or {}
        config = {
            "mode": mode,
            "model": model,
            "model_sha256": model_sha256,
            "data": local_path(resolved.get("data_yaml") or source.get("data_yaml") or "", self.local),
            "split": source.get("split") or (spec.get("train_args") or {}).get("split") or "val",
            "source": local_path(source.get("folder_key") or "", self.local),
            "export": resolved.get("export") or [],
            "engine_allowed": "tensorrt" in (self.job.node.features or []),
            "task": resolved.get("task") or (spec.get("task", "detect") if mode == "train" else None),
            "args": args,
            "device": device,
            "project": str(self.run_dir),
            "name": "train",
            "resume_from": checkpoint.path if checkpoint else None,
            "checkpoint_dir": str(self.checkpoint_dir),
            "events_path": str(self.attempt_dir / f"events-{number}.jsonl"),
            "progress_interval_s": 0.25,
            "config_dir": str(settings.DATA_DIR / "ultralytics-config"),
        }
        path = self.attempt_dir / f"config-{number}.json"
        path.write_text(json.dumps(config, indent=2))
        return path

    def child_env(self) -> dict[str, str]:
        env = trainer_environment()
        env.update({
            "PYTHONUNBUFFERED": "1",
            "YOLO_OFFLINE": "1",
            "YOLO_AUTOINSTALL": "false",
            "YOLO_VERBOSE": "true",
            "CUDA_VISIBLE_DEVICES": "" if self.job.node.simulated else ",".join(map(str, self.job.gpu_indices)),
        })
        if os.environ.get("YOLOPORTAL_FAST_TRAINER") == "1" and "FAST_TRAINER_EPOCH_S" in os.environ:
            # Stress tests only (worker/fast_child.py): its epoch time is not in the allow-list.
            env["FAST_TRAINER_EPOCH_S"] = os.environ["FAST_TRAINER_EPOCH_S"]
        return env

    def run_child(self, number: int, checkpoint: Checkpoint | None) -> ChildResult:
        config = self.child_config(number, checkpoint)
        events_path = Path(json.loads(config.read_text())["events_path"])
        budget = self.job.timeout_s - self.previous_runtime_s
        started = time.monotonic()
        child = self.spawn(config)
        if number == 1:
            recorders.training_started(self.job.node.name, self.job.gpu_indices)
        attempt_heartbeat(self.job)
        result = ChildResult()
        events = EventReader(events_path)
        logs = LogReader(self.log_path)
        last_beat = last_log = time.monotonic()
        stop_reason = ""
        while True:
            exit_code = child.poll()
            for event in events.read():
                self.on_event(event, result)
            now = time.monotonic()
            if now - last_log >= LOG_FLUSH_S or exit_code is not None:
                self.flush_logs(logs)
                last_log = now
            if exit_code is not None:
                break
            if not stop_reason and now - last_beat >= min(settings.HEARTBEAT_S, 2.0):
                last_beat = now
                stop_reason = self.check_in()
            if not stop_reason and now - started > budget:
                stop_reason = "timed_out"
            if stop_reason:
                kill_tree(child)
                continue
            time.sleep(POLL_S)
        for event in events.read():
            self.on_event(event, result)
        self.flush_logs(logs)
        result.exit_code = exit_code
        result.log_tail = self.log_tail[-40:]
        if stop_reason:
            result.outcome = stop_reason
        elif exit_code == 0 and result.finished:
            result.outcome = "succeeded"
        elif exit_code == EXIT_CHECKPOINT and checkpoint is not None:
            result.outcome = "checkpoint_unusable"
        elif exit_code is not None and exit_code < 0:
            result.outcome = "killed"  # by a signal we did not send: OOM killer, an operator, a crash
        else:
            result.outcome = "failed"
        return result

    def spawn(self, config: Path):
        """Fork the training child from the node's zygote when there is one, else exec it afresh."""
        module = "worker.train_child"
        zygote = os.environ.get("YOLOPORTAL_ZYGOTE")
        if os.environ.get("YOLOPORTAL_FAST_TRAINER") == "1":
            # Stress tests only (worker/fast_child.py): the same event contract, no Ultralytics.
            module, zygote = "worker.fast_child", None
        if zygote and Path(zygote).exists():
            try:
                return ZygoteChild(Path(zygote), config=str(config), log=str(self.log_path),
                                   env=self.child_env(), cwd=str(settings.BASE_DIR))
            except (OSError, ValueError) as exc:
                log.warning("zygote unavailable (%s); starting a fresh interpreter", exc)
        with open(self.log_path, "ab") as log_file:
            return subprocess.Popen(
                [sys.executable, "-m", module, str(config)],
                cwd=str(settings.BASE_DIR), env=self.child_env(), stdout=log_file, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=set_parent_death_signal,
            )

    def check_in(self) -> str:
        """Heartbeat the attempt; return why to stop ('' to go on)."""
        close_old_connections()
        return attempt_check_in(self.job)

    def on_event(self, event: dict, result: ChildResult) -> None:
        kind = event.get("type")
        if kind == "epoch":
            metrics_record(self.job, epoch=int(event["epoch"]), values=event.get("values") or {})
        elif kind == "progress":
            live.publish(self.job.pk, {"type": "progress", "seq": None, "job": str(self.job.pk),
                                       "data": {k: v for k, v in event.items() if k != "type"}})
        elif kind == "checkpoint":
            checkpoint_record(self.job, epoch=int(event["epoch"]), path=event["path"], sha256=event["sha256"],
                              size=int(event["size"]))
        elif kind == "started" and event.get("mode", "train") == "train":
            job_event(self.job, "training_started",
                      f"training epochs {event.get('start_epoch', 1)}..{event.get('epochs')}",
                      {k: v for k, v in event.items() if k != "save_dir"})  # a server path: not for the team
        elif kind == "started":
            what = {"val": f"validating on the {event.get('split')} split",
                    "predict": f"predicting on {event.get('images')} images",
                    "export": f"exporting to {', '.join(event.get('formats') or [])}"}.get(event.get("mode"), "started")
            job_event(self.job, f"{event.get('mode')}_started", what, {k: v for k, v in event.items() if k != "type"})
        elif kind == "finished":
            result.finished = event
        elif kind == "error":
            result.error = event

    def flush_logs(self, reader: LogReader) -> None:
        text = reader.read()
        if not text:
            return
        self.log_tail.extend(line for line in text.splitlines() if line.strip())
        self.log_tail = self.log_tail[-200:]
        log_append(self.job, text)
        if reader.offset > LOG_FILE_KEEP_BYTES and log_full(self.job):
            reader.truncate()  # nothing more is stored: keep the node's disk bounded too

    # --- the end ------------------------------------------------------------------------------

    def finish(self, result: ChildResult) -> str:
        if result.outcome == "killed" and worker_died(self.worker_pid, WORKER_SETTLE_S):
            # The whole worker was killed and its zygote's death (the child's exit report)
            # reached us before our own PDEATHSIG. Reporting "killed" would requeue the job
            # onto the node that is dying; the node's silence reports it once instead.
            log.warning("job %s: training and worker died together; leaving it to the node's grace", self.job.pk)
            return "orphaned"
        close_old_connections()
        if result.outcome == "succeeded":
            # Results into the artifact store before the success is recorded (nothing to do on a
            # shared filesystem); while the store is down the job waits here, holding its GPUs.
            _, stop = with_storage(self.job, "uploading results", lambda: results_upload(self.run_dir), self.check_in)
            if stop:
                result.outcome = stop
        return attempt_finish(self.job, outcome=result.outcome, exit_code=result.exit_code,
                              error=self.error_text(result), finished=result.finished)

    @staticmethod
    def error_text(result: ChildResult) -> str:
        parts = []
        if result.error:
            kind = result.error.get("kind", "exception")
            label = {"oom": "CUDA out of memory", "data": "dataset problem", "weights": "weights refused",
                     "export": "export verification failed"}.get(kind, "training error")
            parts.append(f"{label}: {result.error.get('message', '')}".strip())
            if result.error.get("advice"):
                parts.append(f"Advice: {result.error['advice']}")
        elif result.exit_code is not None and result.exit_code < 0:
            parts.append(f"training process was killed by signal {-result.exit_code}")
        else:
            parts.append(f"training process exited with code {result.exit_code}")
        # The traceback stays in the job's files and the worker's log; the team sees what failed.
        tail = traceback_strip(result.log_tail)
        if tail:
            parts.append("Last log lines:\n" + "\n".join(tail[-20:]))
        return "\n".join(parts)[:20000]


def local_path(key: str, local: dict[str, str] | None = None) -> str | None:
    """A resolved artifact key as this node's path (jobs queued before keys held absolute paths);
    ``local`` holds what was fetched from the artifact store."""
    if not key:
        return None
    if local and key in local:
        return local[key]
    return key if key.startswith("/") else str(artifact_path(key))


def resolved_model(resolved: dict, local: dict[str, str] | None = None) -> tuple[str, str]:
    """(what the child loads: a YAML name or an absolute .pt path, the sha256 it must have)."""
    model = resolved.get("model")
    if isinstance(model, str):  # queued before issue 10: a YAML name or an absolute path
        return model, ""
    if model.get("yaml"):
        return model["yaml"], ""
    return local_path(model["key"], local), model.get("sha256") or ""


def worker_died(worker_pid: int, settle_s: float) -> bool:
    """Has the worker that forked this process died (checked for up to ``settle_s``)?

    A signal kills a whole process group at once, but each process runs its exit when it
    next gets a CPU, so on a busy machine the training's death can be seen here while the
    worker is still on its way out.
    """
    deadline = time.monotonic() + settle_s
    while os.getppid() == worker_pid:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def kill_tree(child: subprocess.Popen | ZygoteChild) -> None:
    """SIGTERM the child's process group, SIGKILL what is left after a grace period."""
    try:
        os.killpg(child.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        child.wait(KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    child.wait()


class EventReader:
    """Reads complete JSON lines appended to the child's events file."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.partial = path, 0, b""

    def read(self) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        data = self.partial + data
        *lines, self.partial = data.split(b"\n")
        events = []
        for line in lines:
            try:
                events.append(json.loads(line))
            except ValueError:
                log.warning("ignoring a malformed event line: %r", line[:200])
        return events


class LogReader:
    """Reads new output; progress bars' carriage-return updates collapse to their last state."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.partial = path, 0, ""

    def truncate(self) -> None:
        """Empty the file and read on from its start (the child appends: O_APPEND)."""
        try:
            os.truncate(self.path, 0)
        except OSError:
            return
        self.offset, self.partial = 0, ""

    def read(self) -> str:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(1 << 20)
        except FileNotFoundError:
            return ""
        self.offset += len(data)
        text = self.partial + data.decode("utf-8", "replace")
        *lines, self.partial = text.split("\n")
        return "".join(line.rsplit("\r", 1)[-1].rstrip() + "\n" for line in lines if line.rsplit("\r", 1)[-1].strip())
