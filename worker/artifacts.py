"""A GPU server's side of artifact storage (apps/core/storage.py), for nodes without the
shared DATA_DIR: inputs fetched from the store into the node-local cache before training,
results uploaded after it, and waiting — not failing — while the store is unreachable.

On a shared filesystem (the default) nothing here copies anything: keys resolve to the
files in place. With an object store:

- the dataset folder (the data.yaml's folder) is fetched file by file into
  ``ARTIFACTS_CACHE_DIR/<manifest sha256[:2]>/<manifest sha256>/`` and checked against the
  version's manifest hash (apps.datasets.stats.manifest_sha256); weights by their own
  sha256. An unregistered dataset (no recorded hash) is fetched afresh each time;
- after a success, every file of the job's folder except the attempts' working files
  (configs, events, output logs: the logs are in the database) and the resume checkpoints
  (worker/checkpoint_store.py stored those; apps/jobs/checkpoint_retention.py) is stored under its key
  ``jobs/<id>/…`` before the success is recorded, so the web can serve it at once.

While the store is unreachable the job keeps its GPUs, says why in its ``reason`` (and
one ``storage_wait`` event), and tries again with a growing pause, stopping only for a
cancel or a lost attempt, never failing for it.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import shutil
import stat
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings

from apps.core.artifacts import ArtifactKeyError, artifact_key, artifact_path
from apps.core.storage import (
    StorageUnavailable,
    artifact_listing,
    artifact_local,
    artifact_read,
    artifact_upload,
    shared_filesystem,
)
from apps.core.storage_marks import MARKER_NAME, roots_said, storage_marks_check
from apps.jobs.models import Job

from .cache import cache_entry

log = logging.getLogger(__name__)
WAIT_FIRST_S, WAIT_MAX_S = 2.0, 30.0


@contextmanager
def heartbeating(check_in: Callable[[], str], every_s: float):
    """Run ``check_in`` every ``every_s`` on a thread while the block copies files; yields a
    dict whose "stop" is why to stop ('' to go on) once a check-in said so.

    A fetch or upload takes as long as the data and the network make it (minutes for a large
    dataset): without this the attempt falls silent for that long and the scheduler ends it
    as lost (NODE_GRACE_S) while it is still copying (seen under load: a 300 kB demo dataset
    from a local moto_server took 9 s on the shared CI machine, over the tests' 8 s grace).
    """
    from django.db import connections

    done, found = threading.Event(), {"stop": ""}

    def beat() -> None:
        try:
            while not done.wait(every_s):
                found["stop"] = check_in()
                if found["stop"]:
                    return
        except Exception:  # noqa: BLE001 - a failed check-in is retried by the next one on the main thread
            log.exception("heartbeat during a storage transfer failed")
        finally:
            connections.close_all()  # this thread's own database connections

    thread = threading.Thread(target=beat, name="storage-heartbeat", daemon=True)
    thread.start()
    try:
        yield found
    finally:
        done.set()
        thread.join()


def with_storage(job: Job, what: str, action: Callable, check_in: Callable[[], str]):
    """Run ``action()`` until the store answers, heartbeating the attempt meanwhile;
    (result, '') or (None, why to stop)."""
    from apps.jobs.services import job_event

    pause, told = WAIT_FIRST_S, False
    while True:
        try:
            with heartbeating(check_in, min(settings.HEARTBEAT_S, 2.0)) as beat:
                result = action()
            if beat["stop"]:
                return None, beat["stop"]
        except StorageUnavailable as exc:
            message = f"waiting for artifact storage ({what}): {str(exc)[:300]}"
            # Cut to the column: PostgreSQL refuses a longer value (SQLite stored it).
            Job.objects.filter(pk=job.pk).update(reason=message[: Job._meta.get_field("reason").max_length])
            if not told:
                job_event(job, "storage_wait", message)
                told = True
            log.warning("job %s: %s", job.pk, message)
            stop = check_in()
            if stop:
                return None, stop
            time.sleep(pause)
            pause = min(pause * 2, WAIT_MAX_S)
            continue
        if told:
            Job.objects.filter(pk=job.pk).update(reason="")
            job_event(job, "storage_back", f"artifact storage reachable again ({what})")
        return result, ""


_listing = artifact_listing  # every key under a folder key (apps.core.storage)


def dataset_cache_entry(yaml_key: str, manifest_sha256: str) -> Path:
    """The cache entry (worker/cache.py) that holds the dataset whose data.yaml is ``yaml_key``."""
    folder_key = yaml_key.rsplit("/", 1)[0]
    return cache_entry(manifest_sha256 or "key-" + hashlib.sha256(folder_key.encode()).hexdigest())


def dataset_local(yaml_key: str, manifest_sha256: str) -> Path:
    """This node's data.yaml of the dataset whose data.yaml is ``yaml_key``."""
    if shared_filesystem():
        return artifact_path(yaml_key)
    from apps.datasets.stats import manifest_sha256 as manifest_of
    from apps.datasets.stats import training_byproduct

    folder_key, name = yaml_key.rsplit("/", 1)
    target = dataset_cache_entry(yaml_key, manifest_sha256) / "dataset"
    if manifest_sha256 and target.is_dir():  # complete: it was renamed into place after the check
        return target / name
    staging = target.parent / f".fetch-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        for key in _listing(folder_key):
            if training_byproduct(key):
                continue  # Ultralytics' caches (pickled label caches, .npy images): rebuilt here from the dataset
            relative = key[len(folder_key) + 1:]
            (staging / relative).parent.mkdir(parents=True, exist_ok=True)
            # Streamed (ranged GETs, 1 MiB at a time): django-storages' own open() held each
            # whole file in memory (apps.core.storage.StoredObjectReader).
            with artifact_read(key) as source, open(staging / relative, "wb") as out:
                shutil.copyfileobj(source, out, 1 << 20)
        if manifest_sha256:
            found = manifest_of(staging)[0]
            if found != manifest_sha256:
                raise RuntimeError(f"dataset {folder_key}: manifest {found} in storage, {manifest_sha256} recorded")
        _localise_data_yaml(staging / name, folder_key, target)
        _into_place(staging, target, checked=bool(manifest_sha256))
    except StorageUnavailable:
        raise
    except Exception as exc:
        from apps.core.storage import _unavailable

        if _unavailable(exc):
            raise StorageUnavailable(f"artifact storage unreachable fetching {folder_key}: {exc}") from exc
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target / name


def _into_place(staging: Path, target: Path, *, checked: bool) -> None:
    """Rename a fetched dataset folder to ``target``.

    Two slots of one node may fetch one dataset at once (a sweep's trial beside a job on the
    same dataset). With its manifest ``checked``, a copy another slot renamed into place first
    holds the same files: it is kept (that slot may be training from it) and this one dropped.
    Removing it and renaming this one over it, as before, raced: the other rename landing
    between the two made this one fail with "Directory not empty", and the attempt with it
    (CI, 5 December). Without a manifest the newer fetch replaces the folder, retried if
    another lands in between."""
    for _ in range(5):
        if not checked:
            shutil.rmtree(target, ignore_errors=True)
        try:
            os.rename(staging, target)
            return
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            if checked and target.is_dir():
                return
    os.rename(staging, target)  # still losing the race: say so


def _localise_data_yaml(yaml_file: Path, folder_key: str, local_folder: Path) -> None:
    """Point a fetched data.yaml's absolute ``path`` at this node's copy (after the hash check).

    Uploaded versions have no ``path`` (the YAML's folder is the root). A registered one (the
    demo, an operator's copy) may name an absolute folder inside its own folder on the web
    machine (apps.datasets.selectors.data_yaml_check): left as it was, Ultralytics here would
    read — and write its label caches into — that machine's path, or find nothing at all.
    """
    import yaml

    if not yaml_file.name.endswith((".yaml", ".yml")) or not yaml_file.is_file():
        return
    document = yaml.safe_load(yaml_file.read_text(encoding="utf-8"))
    base = document.get("path") if isinstance(document, dict) else None
    if not isinstance(base, str) or not base.startswith("/"):
        return
    tail = "/" + folder_key.split("/", 1)[1]  # the folder below DATASETS_DIR, wherever that was
    base = base.rstrip("/")
    at = (base + "/").rfind(tail + "/")
    if at < 0:
        log.warning("dataset %s: data.yaml path %s is not inside its folder; left as it is", folder_key, base)
        return
    below = base[at + len(tail):].lstrip("/")
    document["path"] = str(local_folder / below) if below else str(local_folder)
    yaml_file.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")


def weights_local(key: str, sha256: str) -> Path:
    return artifact_path(key) if shared_filesystem() or not sha256 else artifact_local(key, sha256)


def results_upload(run_dir: Path) -> int:
    """Store the job folder's results under their keys; returns how many files."""
    if shared_filesystem() or not run_dir.is_dir():
        return 0
    count, inside = 0, run_dir.resolve()
    for path in sorted(run_dir.rglob("*")):
        relative = path.relative_to(run_dir)
        if not path.is_file() or relative.parts[0].startswith(("attempt-", ".")) or path.name.startswith("."):
            continue
        if path.is_symlink() or not path.resolve().is_relative_to(inside):
            # The child wrote this folder: a link stored another team's file under this job's key
            # (or, resolved, under that team's own key) (sec21, F3).
            log.warning("not storing %s: a link, not a file the job wrote", path)
            continue
        if relative.parts[0] == "checkpoints":
            continue  # resume copies: the store has them under their attempts' keys until they retire
        try:
            key = artifact_key(path)
        except ArtifactKeyError:
            log.warning("not storing %s: its name is not a valid artifact key", path)
            continue
        artifact_upload(key, path)
        count += 1
    return count


def cache_dir() -> Path:
    return Path(settings.ARTIFACTS_CACHE_DIR)


# --- the node's own run folders -----------------------------------------------------------------
# With an object store a GPU server's JOBS_DIR is scratch: a job's results are in the store
# once its success is recorded, its resume checkpoints once each upload is recorded. Left
# alone, every job kept ~100 MB (YOLOv8n: three checkpoints plus weights) on the server for
# ever (multi-node trial M6). On a shared filesystem the folder IS the store: never touched.


def run_folder_scrub(run_dir: Path) -> int:
    """Remove every link, pipe, socket or device from the job's folder; returns how many.

    The folder is the training child's to write (a container job runs the team's own image),
    and the worker and the web read, copy, upload, archive into and delete from it once the
    child is gone: through a link left there, each of those reached another team's files
    (sec21, F6). Run when no child of the job is alive (after it exits; before an attempt)."""
    removed = 0
    if run_dir.is_symlink() or not run_dir.is_dir():
        return 0
    for folder, dirs, files in os.walk(run_dir, followlinks=False):
        for name in dirs + files:
            path = Path(folder) / name
            try:
                mode = path.lstat().st_mode
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(mode) or stat.S_ISREG(mode):
                continue
            try:
                path.unlink()
            except OSError as exc:  # a folder a rootful container made: reads still refuse the link
                log.error("could not remove %s from the job's folder: %s", path, exc)
                continue
            removed += 1
            log.warning("removed %s from the job's folder: not a file or a folder the job may keep", path)
    return removed


def run_folder_remove(run_dir: Path) -> bool:
    """Remove a finished job's run folder from this node (object store only); True if removed."""
    if shared_filesystem() or not run_dir.is_dir():
        return False
    shutil.rmtree(run_dir, ignore_errors=True)
    return not run_dir.exists()


def abandoned_run_folders_remove() -> int:
    """At worker start: remove the run folders of jobs that hold no GPUs anywhere (object store
    only); how many went.

    An attempt this node was running when its worker died, or one requeued to another node,
    left its folder here; the job resumes from the store's checkpoints wherever it goes next.
    Folders of jobs starting or running on *any* node stay (two workers may share a machine's
    DATA_DIR), and so does anything not named like a job.
    """
    import uuid

    from apps.jobs.models import HOLDING_STATES

    jobs_dir = Path(settings.JOBS_DIR)
    if shared_filesystem() or not jobs_dir.is_dir():
        return 0
    if (jobs_dir / MARKER_NAME).exists():
        # The scheduler writes the marker into the roots of a *shared filesystem* only: this is the
        # old shared DATA_DIR of an installation moved into a bucket, still mounted here, not this
        # node's scratch. Emptying it deleted the results of every ended job that `artifacts_push`
        # had not copied (operator trial 29); an operator removes it once the move is checked.
        log.warning("JOBS_DIR %s holds a shared-storage marker (%s): it is the shared DATA_DIR of the filesystem "
                    "installation, not this node's scratch; its job folders are left alone (remove them by hand once "
                    "`manage.py artifacts_push` has copied them: docs/deploy.md)", jobs_dir, MARKER_NAME)
        return 0
    folders = {}
    for folder in jobs_dir.iterdir():
        try:
            folders[str(uuid.UUID(folder.name))] = folder
        except ValueError:
            continue
    holding = {str(pk) for pk in Job.objects.filter(pk__in=list(folders), state__in=HOLDING_STATES)
               .values_list("pk", flat=True)}
    removed = sum(run_folder_remove(folder) for job_id, folder in folders.items()
                  if job_id not in holding and folder.is_dir())
    if removed:
        log.info("removed %d run folder(s) of jobs no longer running (their results and checkpoints are "
                 "in the artifact store)", removed)
    return removed


def shared_storage_missing() -> tuple[object, Path] | None:
    """(the newest dataset, the path this machine lacks) when none of the newest three registered
    datasets' files is here, else None: the shared DATA_DIR is not this machine's (or no longer).

    The fallback until the scheduler has written the storage markers (apps/core/storage_marks.py):
    an installation upgraded before its scheduler ran, or tests without one. One of the newest
    three found is enough (one file lost on the shared storage must not look like a lost mount);
    an installation with no dataset yet has nothing to check (its first dataset is made on a
    machine that has the storage). Without an object store only.
    """
    if not shared_filesystem():
        return None
    from apps.datasets.models import Dataset

    first = None  # (dataset, path) of the newest one, if all are missing
    for dataset in Dataset.objects.select_related("team").order_by("-created_at", "-pk")[:3]:
        try:
            path = artifact_path(dataset.yaml_key or dataset.key)
        except ArtifactKeyError:
            return None  # a key this machine cannot resolve is the job's problem, reported there
        if path.exists():
            return None
        first = first or (dataset, path)
    return first


def shared_storage_problem() -> str:
    """Why this machine cannot run jobs from the shared filesystem, or '' (checked at worker start).

    Without an object store every machine reads the artifacts from one ``DATA_DIR`` mounted at
    the same path. A GPU server started with a ``DATA_DIR`` of its own (a local disk) registered,
    took jobs, and failed each one for good with "dataset YAML not found" (operator trial 20,
    F6). So the worker looks, before it registers, for the installation's marker in each shared
    root (apps/core/storage_marks.py); before the scheduler wrote them, for the newest registered
    dataset versions' files where the database says they are (:func:`shared_storage_missing`).
    """
    advice = (f"without ARTIFACTS_S3_BUCKET every machine must mount the same DATA_DIR at the same path "
              f"(DATA_DIR is {settings.DATA_DIR}; README, Multi-node deployment), or its jobs fail here. Mount "
              f"the shared storage there, or set ARTIFACTS_S3_* (docs/deploy.md, Storage beyond one disk)")
    problems = storage_marks_check()
    if problems is not None:
        if not problems:
            return ""
        said = "; ".join(f"{p.setting}: {p.path} ({p.what})" for p in problems)
        return f"this machine's artifact storage lacks this installation's storage marker in {said}: {advice}"
    missing = shared_storage_missing()
    if missing is None:
        return ""
    dataset, path = missing
    return f"this machine's artifact storage lacks {path}, which dataset {dataset} is stored at: {advice}"


def shared_storage_lost() -> str:
    """Why a running worker can no longer read the shared storage (its mount dropped), or ''.

    The same test as at start, said without paths or dataset names: it becomes the node's
    ``storage_problem`` (apps.cluster), which every user sees in the cluster view and in queued
    jobs' reasons (the worker's log names the missing file: :func:`shared_storage_problem`).
    With the markers it names the roots (``shared storage unreachable: JOBS_DIR (no storage
    marker)``); deleted datasets' files alone no longer count.
    A hung mount makes this call hang too, and with it the heartbeat that makes it: the node is
    then suspected and lost by its silence, which is also right (no new work, its jobs requeued).
    """
    problems = storage_marks_check()
    if problems is not None:
        return f"shared storage unreachable: {roots_said(problems)}" if problems else ""
    missing = shared_storage_missing()
    if missing is None:
        return ""
    return "the shared DATA_DIR is not readable on this node (the newest datasets' files are missing): is it mounted?"


def jobs_dir_full() -> str:
    """Why this node's JOBS_DIR has no room for a training's writes, or ''.

    A training writes its checkpoints (three full ones kept), weights and log into its run folder
    there; below ``JOBS_DIR_MIN_FREE_MB`` a write fails with "No space left on device". That was the
    job's failure, retries spent, and the log that would have said why was cut off by the same full
    disk (fault32). As a storage problem the node takes no new work until there is room (each
    heartbeat looks), and a training that fails meanwhile is requeued (worker.tasks.storage_lost_now).
    """
    floor = settings.JOBS_DIR_MIN_FREE_MB * (1 << 20)
    try:
        usage = shutil.disk_usage(settings.JOBS_DIR)
    except OSError:
        return ""  # a folder that is not there is the storage markers' to report
    if usage.free >= floor:
        return ""
    return (f"storage full: JOBS_DIR has {usage.free / (1 << 20):.0f} MB free of {usage.total / (1 << 30):.1f} GB "
            f"(JOBS_DIR_MIN_FREE_MB={settings.JOBS_DIR_MIN_FREE_MB:g})")


def job_inputs_missing(job: Job) -> list[Path]:
    """The job's dataset and weights files (on the shared filesystem) that are not here."""
    if not shared_filesystem():
        return []
    resolved = job.spec.get("resolved") or {}
    source = resolved.get("source") or {}
    keys = [resolved.get("data_yaml"), source.get("data_yaml"), source.get("folder_key")]
    model = resolved.get("model")
    if isinstance(model, dict):
        keys.append(model.get("key"))
    missing = []
    for key in filter(None, keys):
        try:
            path = Path(key) if key.startswith("/") else artifact_path(key)
        except ArtifactKeyError:
            continue  # the job's own problem: the child reports it
        if not path.exists():
            missing.append(path)
    return missing
