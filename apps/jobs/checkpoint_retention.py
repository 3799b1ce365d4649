"""Resume checkpoints of ended jobs leave the artifact store (issue 11, "Storage beyond one disk").

A running job keeps its newest three stored checkpoints, plus the newest one Ultralytics also
wrote as ``best.pt`` (worker/checkpoint_store.py). Once the job has ended they only cost space,
so the leading scheduler's housekeeping (apps/scheduling/management/commands/scheduler.py,
``Chores``, every ``LOG_ARCHIVE_EVERY_S``) removes them:

- a **succeeded** job's at the next run: it never resumes again, and what it trained is kept
  as its results (``train/weights/best.pt`` and ``last.pt``, uploaded before the success was
  recorded; its model version points at ``best.pt``);
- a **failed, cancelled or timed-out** job's only ``CHECKPOINT_RETENTION_DAYS`` after it
  ended (0, the default, keeps them forever): its newest checkpoint is the only copy of how far
  it trained (its run folder stays on the GPU server that ran it), and an operator may want it.

On the shared filesystem a checkpoint's key is its own file in the job's ``checkpoints/``
folder, so the same rule frees that disk. The object is deleted before its row, and a run
that cannot reach the store stops there and leaves the rest for the next one.

Rows are not the whole story: a node killed in the middle of an upload leaves an object under
``jobs/<id>/checkpoints/`` whose key no row ever recorded (the row gets it only once the upload
is done). So the job's checkpoints prefix is listed as well and every key in it goes with the
rows' (multi-node trial M8).

Nor do rows cover a job that has none left (deleted before its objects were, or a row never
committed): :func:`orphan_job_prefixes_remove` removes a ``jobs/<id>/`` prefix whose id no
Job row has, once nothing in it changed for ``ORPHAN_MIN_AGE`` (24 h: a job being submitted,
restored or written has its row long before that). Anything under ``jobs/`` not named by a
job id is left alone.
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from apps.core.artifacts import artifact_path, root_path
from apps.core.storage import (
    StorageUnavailable,
    _unavailable,
    artifact_delete,
    artifact_listing,
    artifact_storage,
    shared_filesystem,
)

from .models import Checkpoint, Job, JobState

log = logging.getLogger(__name__)
UNSUCCESSFUL = (JobState.FAILED, JobState.CANCELLED, JobState.TIMED_OUT)
ORPHAN_MIN_AGE = timedelta(hours=24)


def checkpoints_housekeeping(now: datetime | None = None, batch: int = 200) -> dict:
    """Delete the stored checkpoints (objects, then rows) of up to ``batch`` ended jobs the rule
    above says are done with; returns what it did."""
    now = now or timezone.now()
    done = {"jobs": 0, "deleted": 0, "storage_unavailable": False, "orphan_prefixes": 0, "orphan_objects": 0}
    ended = Q(job__state=JobState.SUCCEEDED)
    if settings.CHECKPOINT_RETENTION_DAYS > 0:
        ended |= Q(job__state__in=UNSUCCESSFUL,
                   job__finished_at__lt=now - timedelta(days=settings.CHECKPOINT_RETENTION_DAYS))
    # order_by(): Checkpoint's own ordering would make DISTINCT per (job, epoch).
    jobs = list(Checkpoint.objects.filter(ended).order_by("job_id").values_list("job_id", flat=True).distinct()[:batch])
    for job_id in jobs:
        rows = list(Checkpoint.objects.filter(job_id=job_id))
        named = {row.key for row in rows if row.key}
        try:
            orphans = set(artifact_listing(f"jobs/{job_id}/checkpoints")) - named
        except StorageUnavailable as exc:
            log.warning("checkpoint retention: storage unreachable, checkpoints kept for now: %s", exc)
            done["storage_unavailable"] = True
            return done
        # On the shared filesystem each checkpoint file has its sidecar (epoch-NNNN.json: epoch,
        # sha256, size; worker/train_child.py) beside it, which no row names: it goes with its
        # checkpoint, and is not an upload a dying node cut short (optrial24: every succeeded
        # job's retention logged its sidecars as such).
        sidecars = {key for key in orphans if key.endswith(".json") and key[:-len(".json")] + ".pt" in named}
        orphans -= sidecars
        if orphans:
            log.info("checkpoint retention: job %s: %d stored checkpoint(s) no row names (an upload cut short "
                     "by its node's end): %s", job_id, len(orphans), ", ".join(sorted(orphans)))
        failed = False
        for key in sorted(named | sidecars | orphans):
            try:
                artifact_delete(key)
            except StorageUnavailable as exc:  # stops the run
                log.warning("checkpoint retention: storage unreachable, checkpoints kept for now: %s", exc)
                done["storage_unavailable"] = True
                return done
            except Exception as exc:  # noqa: BLE001 - anything else skips the job
                log.warning("checkpoint retention: could not delete %s (kept, tried again next time): %s", key, exc)
                failed = True
                continue
            done["deleted"] += 1
        if not failed:
            Checkpoint.objects.filter(pk__in=[row.pk for row in rows]).delete()
            done["jobs"] += 1
    try:
        done["orphan_prefixes"], done["orphan_objects"] = orphan_job_prefixes_remove(now=now, batch=batch)
    except StorageUnavailable as exc:
        log.warning("orphan job prefixes: storage unreachable, kept for now: %s", exc)
        done["storage_unavailable"] = True
    return done


def _job_ids_in_store() -> list[str]:
    """The job ids that name a folder right under ``jobs/`` in the store."""
    if shared_filesystem():
        root = root_path("jobs")
        names = os.listdir(root) if root.is_dir() else []
    else:
        try:
            names, _ = artifact_storage().listdir("jobs/")
        except Exception as exc:
            if _unavailable(exc):
                raise StorageUnavailable(f"artifact storage unreachable listing jobs: {exc}") from exc
            raise
    ids = []
    for name in names:
        try:
            if str(uuid.UUID(name.strip("/"))) == name.strip("/"):
                ids.append(name.strip("/"))
        except ValueError:
            continue
    return ids


def _last_change(prefix: str, keys: list[str]) -> datetime | None:
    """When anything under ``prefix`` last changed (hidden files and folders included on disk)."""
    if shared_filesystem():
        newest = 0.0
        for folder, _, files in os.walk(artifact_path(prefix)):
            for path in [folder, *(os.path.join(folder, name) for name in files)]:
                try:
                    newest = max(newest, os.lstat(path).st_mtime)
                except FileNotFoundError:
                    pass
        return datetime.fromtimestamp(newest, UTC) if newest else None
    storage = artifact_storage()
    times = [storage.get_modified_time(key) for key in keys]
    return max(times) if times else None


def orphan_job_prefixes_remove(*, now: datetime, batch: int = 200) -> tuple[int, int]:
    """Remove up to ``batch`` ``jobs/<id>/`` prefixes whose id has no Job row and nothing in
    which changed for ``ORPHAN_MIN_AGE``; (prefixes removed, objects deleted)."""
    ids = _job_ids_in_store()
    with_rows = set()
    for start in range(0, len(ids), 500):
        with_rows |= {str(pk) for pk in Job.objects.filter(pk__in=ids[start:start + 500])
                      .values_list("pk", flat=True)}
    prefixes = objects = 0
    for job_id in [job_id for job_id in ids if job_id not in with_rows][:batch]:
        prefix = f"jobs/{job_id}"
        keys = artifact_listing(prefix)
        changed = _last_change(prefix, keys)
        if changed is not None and changed > now - ORPHAN_MIN_AGE:
            continue
        if Job.objects.filter(pk=job_id).exists():  # made meanwhile (a restore): never removed
            continue
        for key in keys:
            artifact_delete(key)
        if shared_filesystem():
            shutil.rmtree(artifact_path(prefix), ignore_errors=True)  # its folders and hidden files too
        log.info("orphan job prefixes: %s/ removed (%d objects): no job has that id, unchanged since %s",
                 prefix, len(keys), changed.isoformat(timespec="seconds") if changed else "?")
        prefixes, objects = prefixes + 1, objects + len(keys)
    return prefixes, objects
