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
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from apps.core.storage import StorageUnavailable, artifact_delete, artifact_listing

from .models import Checkpoint, JobState

log = logging.getLogger(__name__)
UNSUCCESSFUL = (JobState.FAILED, JobState.CANCELLED, JobState.TIMED_OUT)


def checkpoints_housekeeping(now: datetime | None = None, batch: int = 200) -> dict:
    """Delete the stored checkpoints (objects, then rows) of up to ``batch`` ended jobs the rule
    above says are done with; returns what it did."""
    now = now or timezone.now()
    done = {"jobs": 0, "deleted": 0, "storage_unavailable": False}
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
        if orphans:
            log.info("checkpoint retention: job %s: %d stored checkpoint(s) no row names (an upload cut short "
                     "by its node's end): %s", job_id, len(orphans), ", ".join(sorted(orphans)))
        failed = False
        for key in sorted(named | orphans):
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
    return done
