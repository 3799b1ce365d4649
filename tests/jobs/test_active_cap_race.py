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


def test_parallel_retries_under_one_idempotency_key_all_get_the_one_job(bob, demo_registered, node):
    """trial26's race, live: eight submits of one spec under one Idempotency-Key released together.
    Each asks whether the key is used before any has committed; the later ones then meet the first's
    job in the duplicate check or in the key's unique index, and each of those must answer with that
    job (a replay), never a 409 naming it or an error. Repeated, so the interleavings vary."""
    from apps.jobs.models import JobEvent

    spec_dict = {"task_name": "same-key", "team": "vision",
                 "command": "yolo train data=demo model=yolov8n.yaml epochs=1 imgsz=64", "resources": {"gpu": 1}}
    for round_ in range(3):
        key, threads = f"retry-{round_}", 8
        start, lock = threading.Barrier(threads), threading.Lock()
        answers, errors = [], []

        def submit(key=key, start=start, lock=lock, answers=answers, errors=errors) -> None:
            try:
                start.wait(10)
                job, new = job_submit(user=bob, spec=parse_spec(dict(spec_dict)), idempotency_key=key)
                with lock:
                    answers.append((job.pk, new))
            except Exception as exc:  # noqa: BLE001 - reported to the test (a DuplicateJob would land here)
                with lock:
                    errors.append(exc)
            finally:
                connection.close()

        workers = [threading.Thread(target=submit) for _ in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
        assert errors == [] and not any(w.is_alive() for w in workers), errors
        assert len(answers) == threads and len({pk for pk, _ in answers}) == 1, answers
        assert sorted(new for _, new in answers) == [False] * (threads - 1) + [True]
        made = Job.objects.get(idempotency_key=key)
        assert JobEvent.objects.filter(job=made).count() == 1
        Job.objects.filter(pk=made.pk).update(state="cancelled")  # the next round's spec is no duplicate of it
