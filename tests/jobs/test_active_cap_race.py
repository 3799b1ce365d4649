"""Parallel submits of one user cannot pass MAX_ACTIVE_JOBS_PER_USER together: each counts the
user's active jobs in its inserting transaction under the user's row lock (PostgreSQL; SQLite's
IMMEDIATE transactions serialise writers). On PostgreSQL the lock and the inserts are one
statement (apps.core.prepared.rows_insert) and the count the next, with its own snapshot: no
deadlock between two submits that both hold their new rows' key locks on the user, and no count
that misses the job of the submit whose lock it waited for."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from apps.jobs.models import ACTIVE_STATES, Job
from apps.jobs.services import TooManyActiveJobs, job_submit
from apps.jobs.spec import parse_spec

pytestmark = pytest.mark.django_db(transaction=True)


def test_parallel_submits_of_one_user_stop_exactly_at_the_cap(bob, demo_registered, node, settings):
    settings.MAX_ACTIVE_JOBS_PER_USER = 5
    threads, start = 10, threading.Barrier(10)
    created, refused, errors = [], [], []
    lock = threading.Lock()

    def submit(i: int) -> None:
        spec = parse_spec({"task_name": f"race-{i}", "team": "vision", "allow_duplicate": True,
                           "command": "yolo train data=demo model=yolov8n.yaml epochs=1 imgsz=64",
                           "resources": {"gpu": 1}})
        try:
            start.wait(10)
            job, new = job_submit(user=bob, spec=spec, idempotency_key=f"race-key-{i}")
            with lock:
                created.append((job.pk, new))
        except TooManyActiveJobs as exc:
            with lock:
                refused.append(exc)
        except Exception as exc:  # noqa: BLE001 - reported to the test (a deadlock would land here)
            with lock:
                errors.append(exc)
        finally:
            connection.close()

    workers = [threading.Thread(target=submit, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert errors == [] and not any(w.is_alive() for w in workers)
    assert len(created) == 5 and all(new for _, new in created)
    assert len(refused) == 5 and all((exc.count, exc.limit) == (5, 5) for exc in refused)
    assert Job.objects.filter(user=bob, state__in=ACTIVE_STATES).count() == 5
    # A refused submit left nothing behind: no job, event or audit entry of its own.
    from apps.accounts.models import AuditEntry
    from apps.jobs.models import JobEvent

    assert Job.objects.filter(user=bob).count() == 5
    assert JobEvent.objects.filter(job__user=bob).count() == 5
    assert AuditEntry.objects.filter(actor=bob, action="job.submit").count() == 5
