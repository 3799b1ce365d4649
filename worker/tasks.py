"""The RQ job function that runs one attempt of a training job on this node.

It runs in RQ's forked work-horse. The training itself runs in a child process
(``worker.train_child``) started by this node's executor (``worker/executors/``: a
process group in its own cgroup, or a container), so cancel and timeout can stop the
whole tree; the child also gets SIGKILL if this monitor dies (``PR_SET_PDEATHSIG``),
so a dead worker never leaves training running on a GPU the scheduler thinks is free.

It only executes and reports: every change to the job (start, check-in, checkpoints,
metrics, logs, the outcome) goes through ``apps.jobs.services``; no Job field is written here.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections
from django.db.models import Sum
from rq.timeouts import JobTimeoutException

from apps.cluster.services import node_storage_problem_set
from apps.core.artifacts import artifact_path
from apps.core.errors import database_unanswered
from apps.core.faults import fault_point
from apps.core.storage import shared_filesystem
from apps.jobs.models import Checkpoint, Job, JobState
from apps.jobs.paths import traceback_strip
from apps.jobs.services import (
    attempt_can_record,
    attempt_check_in,
    attempt_event_record,
    attempt_finish,
    attempt_heartbeat,
    attempt_previous_stop,
    attempt_previous_stopped,
    attempt_resume_choose,
    attempt_start,
    attempt_stop_grace,
    checkpoint_reject,
    gpus_stopping_left_s,
    infra_requeues_left,
    inside_run_dir,
    job_event,
    job_requeue,
    log_append,
    log_full,
    previous_stop_silent_said,
    previous_stop_wait_said,
)
from apps.monitoring import recorders
from apps.quotas.models import UsageRecord
from apps.scheduling.kick import kick_scheduler
from yoloportal.logs import bind

from .artifacts import (
    dataset_cache_entry,
    dataset_local,
    job_inputs_missing,
    jobs_dir_full,
    results_upload,
    run_folder_remove,
    run_folder_scrub,
    shared_storage_lost,
    shared_storage_problem,
    weights_local,
    with_storage,
)
from .cache import cache_entry, cache_entry_hold, cache_prune
from .checkpoint_store import (
    CheckpointUploader,
    best_restore,
    checkpoint_fetch,
    checkpoint_on_node,
    checkpoint_on_node_check,
    uploads_checkpoints,
)
from .executors.base import (
    AttemptSpec,
    EventReader,
    Executor,
    LogReader,
    error_lines,
    oom_message,
    own_file_create,
    run_outcome,
)
from .executors.cgroups import Limits, Usage, human_bytes, limit_text
from .executors.local import LocalExecutor, host_cgroups, set_parent_death_signal
from .gpulock import GpuLocks, lock_dir

log = logging.getLogger("yoloportal.worker")

POLL_S = 0.25
LOG_FLUSH_S = 1.0
# How long an attempt waits for its GPUs' locks (a stopping attempt's work-horse holds them) before
# it starts anyway; longer while an attempt gracefully preempted on them may still be stopping.
GPU_WAIT_S = 60.0
GPU_POLL_S = 0.5
GPU_CHECK_IN_S = 2.0  # as run_child: a cancel ends the wait within this
# How long a horse whose training was killed by a signal it did not send waits to see
# whether its own worker is dying too (then the node's loss, not the kill, is reported).
WORKER_SETTLE_S = 1.0
# How long past a preempted previous attempt's grace this attempt still waits for it to report
# its stop before choosing a checkpoint: the old worker's check-in (at most 2 s), the kill of its
# child (KILL_GRACE_S), its last events and output, and the clocks of two machines.
PREVIOUS_STOP_MARGIN_S = 15.0
PREVIOUS_STOP_POLL_S = 1.0  # two small reads: has it stopped, is its node still there
PREVIOUS_STOP_CHECK_IN_S = 2.0  # the heartbeat and the cancel check meanwhile (run_child's pace)
# How long a work-horse trusts its answer to "may this attempt still record?" for live progress.
MAY_RECORD_CACHE_S = 1.0
# Once a job's stored log is full, its output file is emptied whenever it grows past this.
LOG_FILE_KEEP_BYTES = 1 << 20
# How long a training work-horse rides out a database that does not answer (SQLite's write lock held
# past its busy timeout by a backup or an `sqlite3` shell; a PostgreSQL restart or failover): the
# child trains on, its events wait in their file, and each write is tried again every
# DATABASE_RETRY_S. Past this the error ends the attempt as any error of ours (attempt_error).
DATABASE_OUTAGE_RIDE_S = 600.0
DATABASE_RETRY_S = 1.0


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
    if storage_lost_hand_back(job_id=job_id, attempt_id=attempt_id, node_name=node_name):
        kick_scheduler()  # placed elsewhere at once, not at the next tick
        return "storage_unavailable"
    # Fenced start: only the current attempt, on the node it was given to, moves to running.
    job = attempt_start(job_id=job_id, attempt_id=attempt_id, node_name=node_name)
    if job is None:
        log.warning("refusing job %s attempt %s: no longer the current attempt for node %s",
                    job_id, attempt_id, node_name)
        return "refused"
    bind(attempt=job.attempt)
    try:
        return AttemptRunner(job).run()
    except Exception as exc:  # noqa: BLE001 - our own code failed: report it, never leave the attempt silent
        return attempt_error(job, exc)
    finally:
        kick_scheduler()
        cache_prune_quietly()


def storage_lost_hand_back(*, job_id: str, attempt_id: str, node_name: str) -> bool:
    """Before a placement starts, on a shared filesystem: if its inputs are missing because this
    node lost the shared storage (not one lost file), mark the node and hand the job back. True if so.

    A node whose mount of the shared DATA_DIR dropped took job after job and failed each for good
    as a "dataset problem". Now the node is marked (``storage_problem``: the scheduler places
    nothing more there until its heartbeat finds the storage again) and the job goes back to the
    queue as the placement it was, keeping its number and its retries, for a node that can read
    it. A file missing while the storage is there stays the job's error, said by the child.
    """
    if not shared_filesystem():
        return False
    job = Job.objects.select_related("node").filter(pk=job_id, attempt_id=attempt_id, state=JobState.STARTING,
                                                    node__name=node_name).first()
    if job is None or not job_inputs_missing(job):
        return False  # not ours to start (attempt_start refuses it), or nothing missing
    problem = shared_storage_lost()
    if not problem:
        return False
    node_storage_problem_set(job.node, problem=problem)
    log.warning("job %s: not started here, handed back to the queue: %s", job_id, shared_storage_problem() or problem)
    return job_requeue(job, kind="storage_unavailable",
                       reason=f"node {node_name} cannot read the shared storage ({problem}); handed back to the "
                              f"queue for a node that can (not counted as a retry)")


def storage_lost_now(job: Job, *, failed: bool = True) -> str:
    """If this node can no longer read the shared storage, or (``failed``: the attempt failed or
    raised) its JOBS_DIR is full, mark the node and say so for the job (why its attempt ended:
    ``storage_lost``, requeued by attempt_finish, not a retry), else ''. A success on a disk it
    filled stays one."""
    problem = shared_storage_lost()  # '' with an object store
    if problem:
        node_storage_problem_set(job.node, problem=problem)
        return f"node {job.node.name} lost the shared storage while the attempt ran: {problem}"
    full = jobs_dir_full() if failed else ""
    if full:
        node_storage_problem_set(job.node, problem=full)
        return f"node {job.node.name} ran out of room while the attempt ran: {full}"
    return ""


def cache_prune_quietly() -> None:
    """After an attempt: keep the node's artifact cache under its cap (worker/cache.py). A
    failure here is the next prune's to retry, never the attempt's outcome."""
    try:
        cache_prune()
    except Exception:  # noqa: BLE001
        log.exception("pruning the artifact cache failed")


def attempt_error(job: Job, exc: Exception) -> str:
    """Our own code raised inside the attempt (staging inputs, recording results, a bug): the
    training tree is already stopped (run_child) and the GPU locks released (run); end the
    attempt now with what was raised, as any failure (a retry if one is left).

    Left unreported, the attempt would look like a lost worker: its heartbeat stops, the
    scheduler requeues it after the node's grace, and the same error comes back on every attempt.
    If the report itself fails (database down) that is what happens, bounded by MAX_LOST_ATTEMPTS.
    """
    log.exception("job %s attempt %d: the worker raised %s", job.pk, job.attempt, type(exc).__name__)
    close_old_connections()
    if isinstance(exc, JobTimeoutException):  # RQ's backstop timeout (dispatch.RQ_TIMEOUT_SLACK_S)
        return attempt_finish(job, outcome="timed_out")
    lost = storage_lost_now(job)  # what raised was most likely a write into the dropped mount
    if lost:
        return attempt_finish(job, outcome="storage_lost", error=lost)
    node = job.node.name if job.node_id else os.environ.get("YOLOPORTAL_NODE", "")
    return attempt_finish(job, outcome="failed", error=f"the worker on {node} could not run the attempt: "
                                                       f"{type(exc).__name__}: {exc}"[:2000])


__all__ = ["run_attempt", "set_parent_death_signal", "trainer_environment", "AttemptRunner", "ChildResult",
           "EventReader", "LogReader"]


def node_executor() -> Executor:
    """This node's executor: its own process groups in cgroups, or containers (WORKER_EXECUTOR)."""
    zygote = os.environ.get("YOLOPORTAL_ZYGOTE")
    host = host_cgroups() if settings.ATTEMPT_CGROUPS else None
    if os.environ.get("YOLOPORTAL_FAST_TRAINER") == "1":
        # Stress tests only (worker/fast_child.py): the same event contract, no Ultralytics.
        return LocalExecutor(host=host, zygote=None, module="worker.fast_child")
    if settings.WORKER_EXECUTOR == "container":
        from .executors.container import ContainerExecutor

        return ContainerExecutor(runtime=settings.CONTAINER_RUNTIME, base_dir=settings.BASE_DIR,
                                 default_image=settings.NODE_IMAGES[0] if settings.NODE_IMAGES else "")
    return LocalExecutor(host=host, zygote=zygote or None)


def child_config(job: Job, *, resume_from: str | None, events_path: Path,
                 local: dict[str, str] | None = None) -> dict:
    """The training child's config (worker/train_child.py) for ``job``'s current attempt.

    What the job asked for, plus what keeps it in its lane: dataloader workers and torch
    threads capped to its CPUs, a fractional GPU's share of memory, the batch as run after
    a CUDA out-of-memory retry (``spec["as_run"]``). ``local`` maps artifact keys to the files
    fetched from the artifact store on a node without the shared DATA_DIR (worker/artifacts.py).
    """
    spec = job.spec
    resolved = spec["resolved"]
    mode = spec.get("mode", "train")
    args = dict(spec.get("train_args") or {})
    for key in ("data", "model", "source", "split", "format", "half", "int8", "dynamic", "simplify", "opset"):
        args.pop(key, None)
    if mode == "export":
        args = {}  # all of them are the export entry's options
    as_run = spec.get("as_run") or {}
    if as_run.get("batch"):
        args["batch"] = as_run["batch"]
    if job.node.simulated and mode in ("train", "val"):
        args.setdefault("workers", 0)  # CPU-only: dataloader processes only compete for cores
    threads = cpu_threads(job)
    if threads is not None and mode in ("train", "val"):
        # Ultralytics' default is 8 dataloader workers, each a process: no more than the CPUs asked for.
        args["workers"] = min(int(args.get("workers", 8)), int(job.cpu_milli // 1000))
    device = "cpu" if job.node.simulated else ",".join(str(i) for i in range(len(job.gpu_indices)))
    model, model_sha256 = resolved_model(resolved, local)
    source = resolved.get("source") or {}
    config = {
        "mode": mode,
        "model": model,
        "model_sha256": model_sha256,
        "data": local_path(resolved.get("data_yaml") or source.get("data_yaml") or "", local),
        "split": source.get("split") or (spec.get("train_args") or {}).get("split") or "val",
        "source": local_path(source.get("folder_key") or "", local),
        "export": resolved.get("export") or [],
        "engine_allowed": "tensorrt" in (job.node.features or []),
        "task": resolved.get("task") or (spec.get("task", "detect") if mode == "train" else None),
        "args": args,
        "device": device,
        "project": str(job.run_dir),
        "name": "train",
        "resume_from": resume_from,
        "checkpoint_dir": str(job.run_dir / "checkpoints"),
        "events_path": str(events_path),
        "progress_interval_s": 0.25,
        "config_dir": str(settings.DATA_DIR / "ultralytics-config"),
        "cpu_threads": threads,
        "gpu_memory_fraction": gpu_memory_fraction(job),
    }
    fault = os.environ.get("YOLOPORTAL_FAULT_CUDA_OOM_ABOVE_BATCH")
    if fault:  # tests only: the child raises CUDA's out-of-memory error above this batch size
        config["fault_cuda_oom_above_batch"] = int(fault)
    return config


def cpu_threads(job: Job) -> int | None:
    """Torch threads for a job that asked for CPUs (at least 1, at most the machine's); None = not asked."""
    if not job.cpu_milli:
        return None
    return max(1, min(math.ceil(job.cpu_milli / 1000), os.cpu_count() or 1))


def gpu_memory_fraction(job: Job) -> float | None:
    """A fractional job's share of its GPU's memory (the child caps itself to it); None = whole GPUs."""
    return round(job.gpu_share, 6) if job.gpu_share < 1.0 else None


def child_env(job: Job) -> dict[str, str]:
    """The training child's environment: the allow-list, the offline switches, its GPUs and caps."""
    env = trainer_environment()
    env.update({
        "PYTHONUNBUFFERED": "1",
        "YOLO_OFFLINE": "1",
        "YOLO_AUTOINSTALL": "false",
        "YOLO_VERBOSE": "true",
        "CUDA_VISIBLE_DEVICES": "" if job.node.simulated else ",".join(map(str, job.gpu_indices)),
    })
    threads = cpu_threads(job)
    if threads is not None:
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
            env[name] = str(threads)
    fraction = gpu_memory_fraction(job)
    if fraction is not None:
        env["YOLOPORTAL_GPU_MEMORY_FRACTION"] = str(fraction)
    if os.environ.get("YOLOPORTAL_FAST_TRAINER") == "1" and "FAST_TRAINER_EPOCH_S" in os.environ:
        # Stress tests only (worker/fast_child.py): its epoch time is not in the allow-list.
        env["FAST_TRAINER_EPOCH_S"] = os.environ["FAST_TRAINER_EPOCH_S"]
    return env


@dataclass
class ChildResult:
    exit_code: int | None = None
    # succeeded | failed | cancelled | timed_out | fenced | checkpoint_unusable | killed | out_of_memory
    outcome: str = ""
    finished: dict | None = None
    error: dict | None = None
    log_tail: list[str] = field(default_factory=list)
    usage: Usage | None = None
    batch: int | None = None  # the batch size the child trained with (its "started" event)
    stopped_epoch: int | None = None  # preempted: the child stopped after this epoch as asked ("stopped")


def other_teams_weights(job: Job) -> tuple[Path, ...]:
    """The folders of the shared weights store that belong to other teams (``weights/<team>/``):
    the store is mounted whole into a container (shared weights, the AMP check's), and the
    team's image must not read another team's weights there (sec21, F4)."""
    store = Path(settings.WEIGHTS_DIR)
    try:
        folders = [path for path in store.iterdir() if path.is_dir() and path.name != job.team.slug]
    except OSError:
        return ()
    return tuple(sorted(folders))


class AttemptRunner:
    """Runs one attempt through an executor (``worker/executors/``) and reports it through the services."""

    def __init__(self, job: Job, executor: Executor | None = None) -> None:
        self.job = job
        self.worker_pid = os.getppid()  # the RQ worker (slot) that forked this work-horse
        self.run_dir = Path(job.run_dir)
        self.attempt_dir = self.run_dir / f"attempt-{job.attempt}"
        self.checkpoint_dir = self.run_dir / "checkpoints"
        self.stop_file = self.attempt_dir / "stop-after-epoch"  # graceful preemption (train_child)
        run_folder_scrub(self.run_dir)  # what an earlier attempt's child left on this node
        for folder in (self.attempt_dir, self.checkpoint_dir):
            if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
                # Left by an earlier attempt's child (the job's folder is the child's to write):
                # the worker writes its config and reads logs here, never through a link (sec21, F2).
                log.warning("job %s: replacing %s, which is not a folder", job.pk, folder)
                folder.unlink()
            folder.mkdir(parents=True, exist_ok=True)
        self.log_path = self.attempt_dir / "output.log"
        self.log_tail: list[str] = []
        self.previous_runtime_s = self._previous_runtime()
        self.previous_wait_s = 0.0  # previous_attempt_wait: spent waiting for a preempted previous attempt
        self.gpu_wait_s = 0.0  # wait_for_gpus: spent waiting for the GPUs' locks
        self.may_record_read: tuple[float, bool] | None = None  # may_record: (monotonic time, answer)
        self.local: dict[str, str] = {}  # artifact key → this node's file (worker/artifacts.py)
        self.executor = executor
        # Without a shared disk each checkpoint goes to the artifact store (worker/checkpoint_store.py).
        self.uploader = CheckpointUploader(job) if uploads_checkpoints(job) else None
        self.verified: dict[int, Path] = {}  # checkpoint pk → this node's file, size and hash checked
        self.cache_holds: list[int] = []  # worker/cache.py: entries this attempt reads

    def _previous_runtime(self) -> float:
        gpu_seconds = UsageRecord.objects.filter(job=self.job).aggregate(s=Sum("gpu_seconds"))["s"] or 0.0
        return gpu_seconds / max(self.job.gpus, 1e-9)

    # --- checkpoints -----------------------------------------------------------------------

    def verified_checkpoints(self) -> list[Checkpoint]:
        """Newest first: on this node with its recorded size and hash, or in the artifact store
        (fetched when tried); the others are dropped.

        A file missing behind a usable newer checkpoint goes without an event: the child's
        keep-N retention deleted it, and its row outlived a worker killed before the next
        checkpoint_record removed it (chaos21: "missing or corrupt" read like corruption while
        the attempt resumed from the newest one). One the resume falls back from is said, in
        words that tell a deleted file from a corrupt one.
        """
        good: list[Checkpoint] = []
        unusable: list[tuple[Checkpoint, str]] = []  # newer than any usable one: the resume falls back
        in_store = not shared_filesystem()
        for ckpt in Checkpoint.objects.filter(job=self.job).order_by("-epoch", "-created_at"):
            if ckpt.key and in_store:
                good.append(ckpt)  # hashed when tried (checkpoint_local), not all of them now
                continue
            local, problem = checkpoint_on_node_check(self.job, ckpt)
            if local is not None:
                self.verified[ckpt.pk] = local  # checkpoint_local need not hash it again
                good.append(ckpt)
            elif problem == "missing" and good:
                log.info("job %s: checkpoint of epoch %d was pruned (keeping the newest); forgetting its row",
                         self.job.pk, ckpt.epoch)
                ckpt.delete()
            else:
                unusable.append((ckpt, problem))
        for ckpt, problem in unusable:
            if problem == "corrupt":
                why = "is corrupt (its size or hash is not the recorded one)"
            elif in_store:
                why = "never reached the artifact store and is not on this node"
            else:
                why = "is no longer on this node (its file was deleted)"
            # The resume starts from the newest usable one: only a bad checkpoint newer than it is
            # "fallen back from"; one behind it is dropped and said so (review22: a corrupt epoch 2
            # behind a good epoch 3 read "falling back to epoch 1").
            resumes = good[0].epoch if good else None
            if resumes is not None and resumes > ckpt.epoch:
                then = f"dropped; the attempt resumes from the newer checkpoint of epoch {resumes}"
            elif resumes is not None:
                then = f"falling back to the checkpoint of epoch {resumes}"
            else:
                then = "no older checkpoint left: starting over"
            checkpoint_reject(self.job, ckpt, message=f"checkpoint of epoch {ckpt.epoch} {why}; {then}")
        return good

    def checkpoint_local(self, checkpoint: Checkpoint) -> tuple[Path | None, str]:
        """(this node's file of ``checkpoint`` or None, why to stop): fetched from the artifact
        store when the attempt that wrote it ran on another node (waiting while the store is down)."""
        path = self.verified.get(checkpoint.pk) or checkpoint_on_node(self.job, checkpoint)
        if path is not None or not checkpoint.key or shared_filesystem():
            return path, ""
        return with_storage(self.job, f"fetching the checkpoint of epoch {checkpoint.epoch}",
                            lambda: checkpoint_fetch(self.job, checkpoint), self.check_in)

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
            for descriptor in self.cache_holds:
                os.close(descriptor)
            self.cache_holds.clear()

    def wait_for_gpus(self, locks: GpuLocks) -> str:
        """Block until the previous attempts on our GPUs have stopped; '' or why to stop instead.

        1. Free: go on. Busy: a stopping attempt's work-horse still holds the lock.
        2. How long to wait, decided once: GPU_WAIT_S (an attempt killed at once stops in a few
           seconds), or longer while an attempt gracefully preempted on these GPUs may still be
           finishing its epoch (its grace plus PREVIOUS_STOP_MARGIN_S: jobs.services.
           gpus_stopping_left_s), counted on this machine's monotonic clock from here.
        3. Check in meanwhile (a cancel or fence ends the wait); past the deadline, start anyway
           (``gpus_busy``) rather than hang.
        The wait is taken from the training's timeout budget (run_child), as it is charged.
        """
        if locks.try_acquire():
            return ""
        began = time.monotonic()
        gpus = ",".join(map(str, self.job.gpu_indices))
        stopping_s = gpus_stopping_left_s(node_name=self.job.node.name, gpu_indices=list(self.job.gpu_indices),
                                          margin_s=PREVIOUS_STOP_MARGIN_S)
        wait_s = max(GPU_WAIT_S, stopping_s)
        log.info("job %s waits up to %.0f s for GPU %s to be released", self.job.pk, wait_s, gpus)
        if stopping_s > GPU_WAIT_S:
            job_event(self.job, "waiting_for_gpus", f"GPU {gpus} still held by a preempted training finishing its "
                                                    f"epoch: waiting up to {wait_s:.0f} s for it to stop",
                      {"gpus": list(self.job.gpu_indices), "wait_s": round(wait_s)})
        last_check_in = -math.inf
        try:
            while not locks.try_acquire():
                now = time.monotonic()
                if now - began > wait_s:
                    job_event(self.job, "gpus_busy", f"GPU {gpus} still held by another process after "
                                                      f"{now - began:.0f} s; starting anyway")
                    return ""
                if now - last_check_in >= GPU_CHECK_IN_S:
                    last_check_in = now
                    stop = self.check_in()
                    if stop:
                        return stop
                time.sleep(GPU_POLL_S)
            return ""
        finally:
            self.gpu_wait_s = time.monotonic() - began

    def stage_inputs(self) -> str:
        """This node's files for the job's dataset and weights ('' or why to stop): in place on a
        shared filesystem, else fetched from the artifact store (waiting while it is down)."""
        if shared_filesystem():
            return ""
        spec = self.job.spec
        resolved, inputs = spec["resolved"], spec.get("inputs") or {}
        source = resolved.get("source") or {}
        wanted = []  # (key, fetch, the cache entry it fills or None)
        for yaml_key in {resolved.get("data_yaml"), source.get("data_yaml")} - {None, ""}:
            if not yaml_key.startswith("/"):
                sha = ((inputs.get("source") if yaml_key == source.get("data_yaml") else None) or inputs.get("data")
                       or {}).get("sha256") or ""
                wanted.append((yaml_key, lambda k=yaml_key, h=sha: dataset_local(k, h), dataset_cache_entry(yaml_key, sha)))
        folder = source.get("folder_key")
        if folder:
            sha = (inputs.get("source") or {}).get("sha256") or ""
            marker = folder + "/.folder"  # the folder itself: fetched as a dataset without a data.yaml
            wanted.append((folder, lambda k=marker, h=sha: dataset_local(k, h).parent, dataset_cache_entry(marker, sha)))
        model = resolved.get("model")
        if isinstance(model, dict) and model.get("key"):
            sha = model.get("sha256") or ""
            wanted.append((model["key"], lambda k=model["key"], h=sha: weights_local(k, h),
                           cache_entry(sha) if sha else None))
        for key, fetch, entry in wanted:
            if entry is not None:  # held until the attempt ends: the node's cache pruning leaves it alone
                self.cache_holds.append(cache_entry_hold(entry))
            path, stop = with_storage(self.job, f"fetching {key}", fetch, self.check_in)
            if stop:
                return stop
            self.local[key] = str(path)
        return ""

    def previous_attempt_wait(self) -> str:
        """Wait, before choosing a checkpoint, while the attempt before this one was preempted and
        may still be finishing its epoch; '' or why to stop instead.

        A gracefully preempted attempt stops at its next epoch end, within its grace, and records
        that epoch's metrics and checkpoint after its requeue. This attempt is often placed and
        started meanwhile: choosing now would resume from the checkpoint before and train that
        epoch again. So it waits for the old attempt's stop report, at most until its grace ends
        (plus PREVIOUS_STOP_MARGIN_S, counted on this machine's monotonic clock: another machine's
        clock bounds nothing here), or until nothing of it can report any more (its node stopping
        or lost, its worker replaced), then goes on with what was recorded and says so. Not at all
        after a crash, a lost node or a retry, or once the old attempt has stopped
        (jobs.services.attempt_previous_stop).
        """
        stop = attempt_previous_stop(self.job, margin_s=PREVIOUS_STOP_MARGIN_S)
        if stop is None:
            return ""
        began = time.monotonic()
        deadline = began + stop.left_s
        previous_stop_wait_said(self.job, stop, before="choosing a checkpoint")
        checked_in = began
        while not attempt_previous_stopped(self.job, stop):
            now = time.monotonic()
            if now >= deadline:
                previous_stop_silent_said(self.job, stop.attempt)
                return ""
            if now - checked_in >= PREVIOUS_STOP_CHECK_IN_S:  # a heartbeat and the cancel check, as run_child's
                checked_in = now
                why = self.check_in()
                if why:
                    return why
            time.sleep(min(PREVIOUS_STOP_POLL_S, max(0.0, deadline - now)))
            self.previous_wait_s = time.monotonic() - began
        self.previous_wait_s = time.monotonic() - began
        return ""

    def resume_candidates(self) -> tuple[list[Checkpoint | None], str]:
        """What to try, in order: the verified checkpoints, newest first, then from scratch (None);
        or why to stop instead.

        1. Training only (val, predict and export start over): wait while the attempt before
           this one may still record its epoch end (:meth:`previous_attempt_wait`).
        2. Close the fence on it (jobs.services.attempt_resume_choose), then read the checkpoints:
           whatever it recorded before is read here, whatever it reports after is refused.
        """
        resumable = self.job.spec.get("mode", "train") == "train"
        if resumable:
            stop = self.previous_attempt_wait()
            if stop:
                return [], stop
        if not attempt_resume_choose(self.job):
            # Taken away meanwhile (cancelled, requeued): reading and rejecting the checkpoints now
            # could drop rows the next attempt needs (review23).
            return [], "fenced"
        return [*(self.verified_checkpoints() if resumable else []), None], ""

    def train(self) -> str:
        fault_point("staging")
        stop = self.stage_inputs()
        if stop:
            return self.finish(ChildResult(outcome=stop))
        candidates, stop = self.resume_candidates()
        if stop:
            return self.finish(ChildResult(outcome=stop))
        result = ChildResult()
        for number, checkpoint in enumerate(candidates, start=1):
            resume_from = None
            if checkpoint is not None:
                resume_from, stop = self.checkpoint_local(checkpoint)
                if stop:
                    return self.finish(ChildResult(outcome=stop))
                if resume_from is None:
                    # Fetched from the artifact store (verified_checkpoints checked this node's files).
                    checkpoint_reject(self.job, checkpoint, message=f"checkpoint of epoch {checkpoint.epoch} is not "
                                                                    f"in the artifact store with its recorded bytes; "
                                                                    f"trying an older one")
                    continue
                # The run's best.pt too, when another node wrote it, or when the checkpoint is a
                # continued job's (apps/jobs/continuation.py): its run folder starts without one.
                if not shared_filesystem() or not (self.run_dir / "train" / "weights" / "best.pt").is_file():
                    _, stop = with_storage(self.job, "fetching best.pt",
                                           lambda c=checkpoint: best_restore(self.job, c.epoch), self.check_in)
                    if stop:
                        return self.finish(ChildResult(outcome=stop))
                job_event(self.job, "resuming", f"resuming from the checkpoint of epoch {checkpoint.epoch}")
            result = self.run_child(number, resume_from)
            if result.outcome != "checkpoint_unusable":
                break
            if lost := storage_lost_now(self.job):
                # Unloadable because the mount dropped, not because the file is bad: rejecting each
                # candidate deleted good rows and failed the job, a retry spent (review22).
                result.outcome, result.error = "storage_lost", {"kind": "storage", "message": lost}
                break
            checkpoint_reject(self.job, checkpoint, message=f"Ultralytics could not load the checkpoint of epoch "
                                                            f"{checkpoint.epoch}; trying an older one")
        # The training tree is gone: its GPUs are free from here (dispatch latency starts).
        # A job already placed on them (starting) waits for our lock, so it counts as waiting.
        recorders.gpus_freed(self.job.node.name, self.job.gpu_indices, jobs_waiting=Job.objects.filter(
            state__in=[JobState.QUEUED, JobState.STARTING]).exclude(pk=self.job.pk).exists())
        return self.finish(result)

    def child_config(self, number: int, resume_from: Path | None) -> Path:
        config = child_config(self.job, resume_from=str(resume_from) if resume_from else None,
                              events_path=self.attempt_dir / f"events-{number}.jsonl", local=self.local)
        config["stop_file"] = str(self.stop_file)  # touched when the attempt is preempted (run_child)
        path = self.attempt_dir / f"config-{number}.json"
        with os.fdopen(own_file_create(path, folder=self.attempt_dir.resolve()), "w") as f:
            f.write(json.dumps(config, indent=2))
        return path

    def child_env(self) -> dict[str, str]:
        return child_env(self.job)

    def attempt_spec(self, number: int, config: Path) -> AttemptSpec:
        job = self.job
        config_values = json.loads(config.read_text())
        read_only = [settings.WEIGHTS_DIR, settings.BASE_DIR / "worker", settings.BASE_DIR / "apps" / "core"]
        for key in ("data", "model", "source"):
            value = config_values.get(key)
            if isinstance(value, str) and value.startswith("/"):
                folder = Path(value) if key == "source" else Path(value).parent
                if folder not in read_only:
                    read_only.append(folder)
        return AttemptSpec(
            key=f"{job.attempt_id}-{number}", config_path=config,
            events_path=Path(config_values["events_path"]), log_path=self.log_path,
            env=self.child_env(), cwd=settings.BASE_DIR,
            limits=Limits.for_request(memory_mb=job.memory_mb, cpu_milli=job.cpu_milli,
                                      pids=settings.ATTEMPT_PIDS_MAX),
            gpu_indices=() if job.node.simulated else tuple(job.gpu_indices),
            image=job.spec.get("image") or "", read_only=tuple(read_only), writable=(self.run_dir,),
            hidden=other_teams_weights(job),
        )

    def run_child(self, number: int, resume_from: Path | None) -> ChildResult:
        # The waits for a preempted previous attempt and for the GPUs' locks (a preempted attempt
        # on them) held this attempt's GPUs (charged from its start) and may each be as long as the
        # preemption's grace, longer than RQ's backstop slack.
        budget = self.job.timeout_s - self.previous_runtime_s - self.previous_wait_s - self.gpu_wait_s
        if budget <= 0:  # nothing left to train with: not started only to be stopped at its first poll
            return ChildResult(outcome="timed_out")
        config = self.child_config(number, resume_from)
        spec = self.attempt_spec(number, config)
        started = time.monotonic()
        execution = (self.executor or node_executor()).start(spec)
        result = ChildResult()
        last_beat = last_log = time.monotonic()
        stop_reason = ""
        stop_by: float | None = None  # graceful preemption: stopped by force only if not done by then
        try:
            if number == 1:
                recorders.training_started(self.job.node.name, self.job.gpu_indices)
            attempt_heartbeat(self.job)
            while True:
                exit_code = execution.poll()
                for event in execution.events():
                    self.through_outage(self.on_event, event, result)
                now = time.monotonic()
                if now - last_log >= LOG_FLUSH_S or exit_code is not None:
                    self.flush_logs(execution.log_reader)
                    last_log = now
                if exit_code is not None:
                    break
                if not stop_reason and now - last_beat >= min(settings.HEARTBEAT_S, 2.0):
                    last_beat = now
                    stop_reason = self.through_outage(self.check_in)
                    if stop_reason == "fenced":
                        grace = attempt_stop_grace(self.job)
                        if grace:  # preempted: the child stops after its current epoch's checkpoint
                            os.close(own_file_create(self.stop_file, folder=self.attempt_dir.resolve(), append=True))
                            stop_by = now + grace
                            job_event(self.job, "stopping", f"preempted: stopping at the end of the current "
                                                            f"epoch (at most {grace:.0f} s)")
                if not stop_reason and now - started > budget:
                    stop_reason = "timed_out"
                if stop_reason and (stop_by is None or now >= stop_by):
                    execution.stop()
                    continue
                time.sleep(POLL_S)
            for event in execution.events():
                self.through_outage(self.on_event, event, result)
            self.flush_logs(execution.log_reader, final=True)
            if stop_by is not None:
                execution.stop()  # DDP ranks of a child that stopped itself
            result.usage = execution.usage()
        except BaseException:
            execution.stop()  # our code raised (or RQ's timeout): no training left on the GPUs
            raise
        finally:
            execution.close()
            run_folder_scrub(self.run_dir)  # the child is gone: no link it left is followed from here on
        result.exit_code = exit_code
        result.log_tail = self.log_tail[-40:]
        result.outcome = run_outcome(exit_code=exit_code, finished=result.finished, resumed=resume_from is not None,
                                     stop_reason=stop_reason, usage=result.usage)
        if result.usage is not None:
            self.report_usage(result.usage, wall_s=time.monotonic() - started)
        return result

    def report_usage(self, usage: Usage, *, wall_s: float) -> None:
        """What the attempt's cgroup measured, in its timeline (peak memory, CPU time, OOM kills)."""
        parts = []
        if usage.memory_peak_bytes is not None:
            limit = f" of {limit_text(usage.memory_limit_bytes)}" if usage.memory_limit_bytes else ""
            parts.append(f"peak memory {human_bytes(usage.memory_peak_bytes)}{limit}")
        if usage.cpu_seconds is not None:
            parts.append(f"{usage.cpu_seconds:.1f} CPU-seconds in {wall_s:.1f} s")
        if usage.oom_kills:
            parts.append(f"{usage.oom_kills} process(es) killed for memory")
        job_event(self.job, "attempt_resources", "; ".join(parts) or "no measurements",
                  {**usage.as_dict(), "wall_s": round(wall_s, 3)})

    def through_outage(self, write, *args, **kwargs):
        """``write(*args, **kwargs)``, tried again every DATABASE_RETRY_S while the database does not
        answer, for at most DATABASE_OUTAGE_RIDE_S; one WARNING when it stops answering, one INFO when
        it answers again.

        A training's events are read from its file once: a write that failed lost its event, and
        the error ended the attempt as one of ours, the job ``failed`` (or a retry spent) with
        "could not run the attempt: OperationalError: database is locked" while nothing was wrong
        with it (fault32: a 45 s SQLite lock failed both running jobs). Meanwhile the child trained
        on and its keep-3 retention deleted the one checkpoint recorded, so a requeue would have
        started over. Each write here may be repeated: a metric point and a checkpoint row are
        upserts, a log chunk is appended once (its transaction rolled back).
        """
        since = None
        while True:
            try:
                answer = write(*args, **kwargs)
            except (OperationalError, InterfaceError) as exc:
                if not database_unanswered(exc):
                    raise  # an error in what was asked (a missing migration, a bug): no use waiting
                now = time.monotonic()
                if since is None:
                    since = now
                    log.warning("job %s attempt %d: the database does not answer (%s: %s); the training goes on "
                                "and its reports wait, retrying every %g s for up to %g s", self.job.pk,
                                self.job.attempt, type(exc).__name__, exc, DATABASE_RETRY_S, DATABASE_OUTAGE_RIDE_S)
                if now - since >= DATABASE_OUTAGE_RIDE_S:
                    raise
                time.sleep(DATABASE_RETRY_S)
                close_old_connections()  # a broken PostgreSQL connection is replaced
                continue
            if since is not None:
                log.info("job %s attempt %d: the database answers again after %.0f s", self.job.pk,
                         self.job.attempt, time.monotonic() - since)
            return answer

    def check_in(self) -> str:
        """Heartbeat the attempt; return why to stop ('' to go on)."""
        close_old_connections()
        return attempt_check_in(self.job)

    def may_record(self) -> bool:
        """Whether this attempt may still record live progress (jobs.services.attempt_can_record),
        read at most once per MAY_RECORD_CACHE_S of this machine's monotonic clock: the child
        reports progress up to 4 times a second, and a read each doubled a training's statements
        (review23, 7). A work-horse woken from SIGSTOP reads again: CLOCK_MONOTONIC ran on."""
        now = time.monotonic()
        if self.may_record_read is None or now - self.may_record_read[0] >= MAY_RECORD_CACHE_S:
            self.may_record_read = (now, attempt_can_record(self.job))
        return self.may_record_read[1]

    def on_event(self, event: dict, result: ChildResult) -> None:
        kind = event.get("type")
        if kind == "finished":
            result.finished = event
        elif kind == "error":
            result.error = event
        elif kind == "stopped":
            result.stopped_epoch = int(event.get("epoch") or 0)
            job_event(self.job, "stopped_at_epoch_end", f"stopped after epoch {event.get('epoch')} as asked",
                      {"epoch": event.get("epoch")})
        else:
            if kind == "started" and event.get("batch"):
                result.batch = int(event["batch"])
            attempt_event_record(self.job, event, may_record=self.may_record() if kind == "progress" else None)
            # Only what was recorded: a checkpoint outside the job's folder is not this job's (sec21).
            if kind == "checkpoint" and self.uploader is not None and inside_run_dir(self.job, str(event.get("path") or "")):
                self.uploader.offer(epoch=int(event["epoch"]), path=str(event["path"]), sha256=str(event["sha256"]))

    def flush_logs(self, reader: LogReader, final: bool = False) -> None:
        """Store the child's new output (``final``: it has exited, so all of it: LogReader.read)."""
        text = reader.read(final=final)
        if not text:
            return
        self.log_tail.extend(line for line in text.splitlines() if line.strip())
        self.log_tail = self.log_tail[-200:]
        self.through_outage(log_append, self.job, text, from_attempt=True)  # read once: not lost to an outage
        if reader.offset > LOG_FILE_KEEP_BYTES and self.through_outage(log_full, self.job):
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
        if self.uploader is not None:
            if result.outcome == "fenced" and result.stopped_epoch is None:
                self.uploader.abandon()  # the job is no longer this attempt's: another may be writing it
            else:  # the next attempt, on whichever node, resumes from the last epoch
                # Also a preempted attempt that stopped at its epoch end: the next attempt waits for
                # its attempt_stopped (below) to resume from that epoch, on another node through the
                # store. Its key names this attempt, so no later attempt's object is touched.
                self.uploader.close(self.check_in)
        if (result.outcome == "succeeded" and infra_requeues_left(self.job)) or (
                result.outcome == "failed" and (result.error or {}).get("kind") != "oom"):
            self.storage_lost_check(result)  # a success past that budget stays one, never failed (review23)
        if result.outcome == "succeeded":
            # Results into the artifact store before the success is recorded (nothing to do on a
            # shared filesystem); while the store is down the job waits here, holding its GPUs.
            _, stop = with_storage(self.job, "uploading results", lambda: results_upload(self.run_dir), self.check_in)
            if stop:
                result.outcome = stop
        error = result.error or {}
        outcome = attempt_finish(self.job, outcome=result.outcome, exit_code=result.exit_code,
                                 error=self.error_text(result, self.job.spec.get("mode") or "train"),
                                 finished=result.finished,
                                 cuda_oom_batch=(error.get("batch") or result.batch)
                                 if error.get("kind") == "oom" and error.get("cuda") else None)
        if outcome == "succeeded" and Job.objects.filter(pk=self.job.pk, state=JobState.SUCCEEDED).exists():
            # Stored and recorded: with an object store this node's copy is only disk (M6).
            run_folder_remove(self.run_dir)
        return outcome

    def storage_lost_check(self, result: ChildResult) -> None:
        """A training that failed while this node cannot read the shared storage failed for that
        (a "dataset YAML not found" that raced the pre-check, a checkpoint write into a dropped
        mount): the node is marked and the job requeued elsewhere (``storage_lost``), not failed.

        One that *succeeded* meanwhile is requeued too: what it wrote after the mount went (its
        weights, its last checkpoints) is on this node's empty mount point, where no other machine
        and no download finds it, so recording the success would register weights nobody can
        fetch. The next attempt resumes from the newest checkpoint that is on the storage; one of
        the final epoch only reports the training finished (train_child), so a mount that
        flickered after the results were written costs a restart, not the training."""
        lost = storage_lost_now(self.job, failed=result.outcome != "succeeded")
        if lost:
            result.outcome, result.error = "storage_lost", {"kind": "storage", "message": lost}

    @staticmethod
    def error_text(result: ChildResult, mode: str) -> str:
        parts = []
        if result.outcome == "storage_lost" and result.error:
            return result.error["message"][:2000]  # the child's own error was a consequence
        if result.outcome == "out_of_memory" and result.usage is not None:
            parts.append(oom_message(result.usage))
        elif result.error:
            parts.extend(error_lines(result.error, mode))
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
