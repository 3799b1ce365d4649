"""Hot and cold logs: a finished job's log chunks leave the database for the artifact storage.

Logs are most of the database's bulk (up to ``JOB_LOG_MAX_BYTES`` per job) and are read
almost only while a job runs and soon after. :func:`logs_housekeeping` (the scheduler runs
it every ``LOG_ARCHIVE_EVERY_S``) moves the chunks of each job finished more than
``LOG_HOT_DAYS`` ago into one gzip of JSON lines under ``jobs/<id>/logs/chunks.jsonl.gz``
(apps/core/storage.py: the shared filesystem or the bucket): written, read back and
compared first, then — in one transaction — the job's ``logs_key`` is set and its chunks
deleted. :func:`log_chunks` reads either, so the job page, the API and the CLI show the same
chunks (seq, attempt, text, time) byte for byte, only slower. Nothing is deleted unless
``LOG_RETENTION_DAYS`` says so (then the logs of jobs finished longer ago than that, archived
or still in the database).
"""

from __future__ import annotations

import gzip
import json
import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from apps.core.storage import StorageUnavailable, artifact_read, artifact_save_bytes, artifact_storage

from .models import TERMINAL_STATES, Job, LogChunk

log = logging.getLogger(__name__)


def archive_key(job: Job) -> str:
    return f"jobs/{job.pk}/logs/chunks.jsonl.gz"


def _encode(rows: list[dict]) -> bytes:
    lines = "".join(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n" for row in rows)
    return gzip.compress(lines.encode(), mtime=0)


def _decode(blob: bytes) -> list[dict]:
    return [json.loads(line) for line in gzip.decompress(blob).decode().splitlines() if line]


def _row(chunk: LogChunk) -> dict:
    return {"seq": chunk.seq, "attempt": chunk.attempt, "text": chunk.text, "created_at": chunk.created_at.isoformat()}


def archive_job_logs(job: Job) -> int:
    """Move ``job``'s chunks into the storage; returns how many (0: nothing to move)."""
    chunks = list(LogChunk.objects.filter(job=job).order_by("seq"))
    if not chunks or job.state not in TERMINAL_STATES:
        return 0
    rows = [_row(c) for c in chunks]
    key = archive_key(job)
    if job.logs_key:  # archived before and new chunks since (should not happen): keep both
        with artifact_read(job.logs_key) as handle:
            rows = sorted({r["seq"]: r for r in _decode(handle.read()) + rows}.values(), key=lambda r: r["seq"])
    blob = _encode(rows)
    artifact_save_bytes(key, blob)
    with artifact_read(key) as handle:
        if handle.read() != blob:
            raise RuntimeError(f"log archive {key} reads back different from what was written; chunks kept")
    with transaction.atomic():
        Job.objects.filter(pk=job.pk).update(logs_key=key)
        LogChunk.objects.filter(pk__in=[c.pk for c in chunks]).delete()
    return len(chunks)


def log_chunks(job: Job, *, after: int = 0, limit: int | None = None, newest: int | None = None) -> list[LogChunk]:
    """The job's chunks with seq > ``after`` in seq order (at most ``limit``; or the last
    ``newest``), from the database or its archive. Archived ones are unsaved LogChunk objects."""
    if job.logs_key:
        with artifact_read(job.logs_key) as handle:
            rows = [r for r in _decode(handle.read()) if r["seq"] > after]
        chunks = [LogChunk(job_id=job.pk, seq=r["seq"], attempt=r["attempt"], text=r["text"],
                           created_at=parse_datetime(r["created_at"])) for r in rows]
        # Chunks written after the archive (none are expected for a finished job) come last.
        chunks += list(LogChunk.objects.filter(job=job, seq__gt=max([after, *(c.seq for c in chunks)])).order_by("seq"))
    elif newest is not None:
        return list(reversed(LogChunk.objects.filter(job=job, seq__gt=after).order_by("-seq")[:newest]))
    else:
        query = LogChunk.objects.filter(job=job, seq__gt=after).order_by("seq")
        return list(query[:limit] if limit is not None else query)
    if newest is not None:
        return chunks[-newest:]
    return chunks[:limit] if limit is not None else chunks


def logs_gone_note(job: Job, now: datetime | None = None) -> str:
    """Why an ended job shows no log, when ``LOG_RETENTION_DAYS`` is what removed it ("" otherwise).

    Retention deletes the archive and clears ``logs_key``, so the job then looks as if it had never
    logged: the API's logs page, ``yoloq logs`` and the job page said nothing (optrial24). Derived,
    not stored: a job that ended longer ago than the retention and has neither an archive nor
    chunks. Callers ask only when they found no chunk at all.
    """
    if settings.LOG_RETENTION_DAYS <= 0 or job.logs_key or job.state not in TERMINAL_STATES or not job.finished_at:
        return ""
    if job.is_sweep or job.first_started_at is None:
        return ""  # logs come only from attempts: a sweep's parent or a job that never started had none
    now = now or timezone.now()
    if job.finished_at >= now - timedelta(days=settings.LOG_RETENTION_DAYS):
        return ""
    if LogChunk.objects.filter(job=job).exists():
        return ""
    return (f"no log: logs are deleted {settings.LOG_RETENTION_DAYS:g} days after a job ends (LOG_RETENTION_DAYS), "
            f"and this job ended {job.finished_at:%Y-%m-%d %H:%M} UTC")


def logs_housekeeping(now: datetime | None = None, batch: int = 200) -> dict:
    """Apply LOG_RETENTION_DAYS; archive the logs of jobs finished more than LOG_HOT_DAYS ago.

    1. Retention first: the chunks of jobs finished longer ago than the retention that are still
       in the database are deleted there (a retention shorter than LOG_HOT_DAYS kept them until
       LOG_HOT_DAYS, then archived and deleted them in one pass: optrial24), and then the
       archives of such jobs.
    2. The remaining cold chunks are archived.
    """
    now = now or timezone.now()
    done = {"archived_jobs": 0, "archived_chunks": 0, "deleted_archives": 0, "deleted_hot_jobs": 0,
            "storage_unavailable": False}
    if settings.LOG_RETENTION_DAYS > 0:
        expired_at = now - timedelta(days=settings.LOG_RETENTION_DAYS)
        hot = list(Job.objects.filter(state__in=TERMINAL_STATES, finished_at__lt=expired_at)
                   .filter(Exists(LogChunk.objects.filter(job=OuterRef("pk")))).values_list("pk", flat=True)[:batch])
        if hot:
            LogChunk.objects.filter(job_id__in=hot).delete()
            done["deleted_hot_jobs"] = len(hot)
        for job in Job.objects.filter(finished_at__lt=expired_at).exclude(logs_key="")[:batch]:
            try:
                artifact_storage().delete(job.logs_key)
            except Exception as exc:  # noqa: BLE001 - the storage's own errors vary; retried next time
                log.warning("log retention: could not delete %s: %s", job.logs_key, exc)
                continue
            Job.objects.filter(pk=job.pk).update(logs_key="")
            done["deleted_archives"] += 1
    # EXISTS, not a join + DISTINCT: the chunks table is the database's largest.
    cold = (Job.objects.filter(state__in=TERMINAL_STATES, finished_at__lt=now - timedelta(days=settings.LOG_HOT_DAYS))
            .filter(Exists(LogChunk.objects.filter(job=OuterRef("pk")))).order_by("finished_at")[:batch])
    for job in cold:
        try:
            moved = archive_job_logs(job)
        except StorageUnavailable as exc:
            log.warning("log archive: storage unreachable, the logs stay in the database for now: %s", exc)
            done["storage_unavailable"] = True
            return done
        done["archived_jobs"] += 1 if moved else 0
        done["archived_chunks"] += moved
    return done
