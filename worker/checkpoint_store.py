"""Resume checkpoints through the artifact store, so a job resumes on any GPU server (issue 11).

On a shared filesystem (the default) nothing here copies anything: the child's
``checkpoints/epoch-NNNN.pt`` is where the store keeps it, and ``checkpoint_record`` records
its key at once. With an object store, where servers do not share a disk:

1. after each checkpoint the child reports, the attempt's monitor hands it to a
   :class:`CheckpointUploader` thread: training (another process) never waits for it, and a
   newer checkpoint replaces one still waiting (only the newest matters for a resume);
2. once the bytes are stored under :func:`checkpoint_key` (the attempt is in the name, so an
   attempt that lost its node cannot overwrite the bytes of the one that replaced it), the row
   gets that key (``checkpoint_stored``), and stored checkpoints beyond the newest
   ``KEEP_CHECKPOINTS`` leave the store;
3. when the attempt ends (a requeue, a preemption, a failure) the monitor waits for the upload
   in flight, heartbeating the attempt, so the next attempt starts from the last epoch;
4. a new attempt on a node without the file fetches it (checked against the row's sha256) into
   its own run folder before resuming (:func:`checkpoint_fetch`), and ``best.pt`` with it
   (:func:`best_restore`): the newest checkpoint the child said was also written as best.pt
   is kept in the store beyond the newest three for that.

While the store is unreachable the uploader keeps retrying the newest checkpoint with a
growing pause; training goes on, and a resume elsewhere falls back to the newest one stored.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
from pathlib import Path

from apps.core.hashing import file_sha256
from apps.core.storage import ArtifactChanged, StorageUnavailable, artifact_local, artifact_storage, artifact_upload
from apps.jobs.models import Checkpoint, Job
from apps.jobs.services import checkpoint_stored

from .artifacts import WAIT_FIRST_S, WAIT_MAX_S, heartbeating
from .executors.base import own_file_create
from .train_child import KEEP_CHECKPOINTS

log = logging.getLogger(__name__)


def checkpoint_key(job: Job, epoch: int) -> str:
    return f"jobs/{job.pk}/checkpoints/epoch-{epoch:04d}-attempt-{job.attempt}.pt"


def checkpoint_on_node(job: Job, checkpoint: Checkpoint) -> Path | None:
    """This node's file of ``checkpoint`` with its recorded size and hash, if it has one.

    Looked for in this node's run folder only (where the attempt wrote it when it ran here,
    or where a fetch put it): the recorded path is the writer's, and another node's DATA_DIR
    is neither this node's to read nor inside what the training may see (its sandbox).
    """
    return checkpoint_on_node_check(job, checkpoint)[0]


def checkpoint_on_node_check(job: Job, checkpoint: Checkpoint) -> tuple[Path | None, str]:
    """(this node's file of ``checkpoint``, "") or (None, "missing" | "corrupt"): no file (deleted,
    never here), or a file whose size or hash is not the recorded one (:func:`checkpoint_on_node`)."""
    path = Path(job.run_dir) / "checkpoints" / Path(checkpoint.path).name
    if not path.is_file():
        return None, "missing"
    if path.stat().st_size == checkpoint.size and file_sha256(path) == checkpoint.sha256:
        return path, ""
    return None, "corrupt"


def checkpoint_fetch(job: Job, checkpoint: Checkpoint) -> Path | None:
    """Fetch ``checkpoint`` from the store into this node's run folder (with the sidecar the child
    checks); None when the store no longer has those bytes. Raises StorageUnavailable."""
    try:
        fetched = artifact_local(checkpoint.key, checkpoint.sha256)
    except (FileNotFoundError, ArtifactChanged) as exc:
        log.warning("job %s: checkpoint of epoch %d not usable from the store: %s", job.pk, checkpoint.epoch, exc)
        return None
    except StorageUnavailable:
        raise
    except Exception as exc:  # noqa: BLE001 - S3 answers a missing key with its own error kinds
        if "NoSuchKey" in str(exc) or "404" in str(exc):
            log.warning("job %s: checkpoint of epoch %d is not in the store: %s", job.pk, checkpoint.epoch, exc)
            return None
        raise
    folder = Path(job.run_dir) / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"epoch-{checkpoint.epoch:04d}.pt"
    shutil.move(fetched, target)  # out of the cache: the run folder keeps it, the cache would double it
    sidecar = target.with_suffix(".json")
    # Not through a link an earlier attempt's child left in the job's folder (sec21, F5).
    with os.fdopen(own_file_create(sidecar, folder=Path(job.run_dir).resolve()), "w") as f:
        f.write(json.dumps({"epoch": checkpoint.epoch, "sha256": checkpoint.sha256, "size": checkpoint.size}))
    return target


def best_restore(job: Job, resume_epoch: int) -> bool:
    """Put the run's ``best.pt`` back before resuming on a node without it (True when it did).

    Ultralytics resumes with the checkpoint's best fitness and writes ``best.pt`` only for an
    epoch that beats it, so without this a job moved after its best epoch would end with
    ``last.pt`` as its weights. ``best.pt`` is byte for byte the checkpoint of the newest epoch
    the child reported as ``best`` (no later than the one resumed from).
    """
    row = (Checkpoint.objects.filter(job=job, best=True, epoch__lte=resume_epoch).order_by("-epoch").first())
    target = Path(job.run_dir) / "train" / "weights" / "best.pt"
    if row is None or (target.is_file() and file_sha256(target) == row.sha256):
        return False
    source = checkpoint_on_node(job, row) or (checkpoint_fetch(job, row) if row.key else None)
    if source is None:
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(".best.pt.restore")
    # Not through a link an earlier attempt's child left in the job's folder (sec21, F5).
    with open(source, "rb") as bytes_in, os.fdopen(own_file_create(temporary, folder=Path(job.run_dir).resolve()),
                                                   "wb") as bytes_out:
        shutil.copyfileobj(bytes_in, bytes_out)
    temporary.replace(target)
    log.info("job %s: best.pt restored from the checkpoint of epoch %d", job.pk, row.epoch)
    return True


class CheckpointUploader:
    """Stores the newest checkpoint an attempt reported, on a thread of the attempt's monitor."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self._pending: tuple[int, str, str] | None = None  # (epoch, path, sha256)
        self._closing = False
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def offer(self, *, epoch: int, path: str, sha256: str) -> None:
        with self._wake:
            self._pending = (epoch, path, sha256)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="checkpoint-upload", daemon=True)
                self._thread.start()
            self._wake.notify()

    def close(self, check_in) -> None:
        """Store what is pending or in flight (one try each while the store is down), heartbeating
        the attempt with ``check_in`` meanwhile, then stop the thread."""
        with self._wake:
            self._closing = True
            self._wake.notify()
            thread = self._thread
        if thread is None:
            return
        from django.conf import settings

        with heartbeating(check_in, min(settings.HEARTBEAT_S, 2.0)):
            thread.join()

    def abandon(self) -> None:
        """Stop without waiting (the attempt is no longer the job's: its checkpoints do not matter)."""
        with self._wake:
            self._closing = True
            self._pending = None
            self._wake.notify()

    def _run(self) -> None:
        from django.db import connections

        pause = WAIT_FIRST_S
        try:
            while True:
                with self._wake:
                    while self._pending is None and not self._closing:
                        self._wake.wait()
                    if self._pending is None:
                        return
                    item, self._pending = self._pending, None
                if self._store(*item):
                    pause = WAIT_FIRST_S
                    continue
                with self._wake:  # the store is down: try again later, unless a newer one came
                    if self._closing:
                        return
                    if self._pending is None:
                        self._pending = item
                    self._wake.wait(pause)
                pause = min(pause * 2, WAIT_MAX_S)
        finally:
            connections.close_all()  # this thread's own database connections

    def _store(self, epoch: int, path: str, sha256: str) -> bool:
        """Upload one checkpoint and record its key; False while the store is unreachable."""
        key = checkpoint_key(self.job, epoch)
        try:
            stored = artifact_upload(key, Path(path))
        except FileNotFoundError:
            return True  # pruned by the child already: a newer one was reported after it
        except StorageUnavailable as exc:
            log.warning("job %s: checkpoint of epoch %d not stored yet: %s", self.job.pk, epoch, exc)
            return False
        except Exception:  # noqa: BLE001 - a resume elsewhere falls back to an older checkpoint
            log.exception("job %s: storing the checkpoint of epoch %d failed", self.job.pk, epoch)
            return True
        unneeded = [key] if stored != sha256 else []  # replaced on disk meanwhile: not the recorded bytes
        try:
            if not unneeded:
                unneeded = checkpoint_stored(self.job, epoch=epoch, sha256=sha256, key=key, keep=KEEP_CHECKPOINTS)
                log.info("job %s: checkpoint of epoch %d stored as %s", self.job.pk, epoch, key)
            for old in unneeded:
                artifact_storage().delete(old)
        except Exception:  # noqa: BLE001 - an object left behind costs space, not correctness
            log.exception("job %s: recording the stored checkpoint of epoch %d failed", self.job.pk, epoch)
        return True


def uploads_checkpoints(job: Job) -> bool:
    """Does this attempt store its checkpoints through an object store? (training, no shared disk)"""
    from apps.core.storage import shared_filesystem

    return job.spec.get("mode", "train") == "train" and not shared_filesystem()


__all__ = ["CheckpointUploader", "best_restore", "checkpoint_fetch", "checkpoint_key", "checkpoint_on_node",
           "checkpoint_on_node_check", "uploads_checkpoints"]
