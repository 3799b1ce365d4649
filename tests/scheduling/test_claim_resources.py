"""A claim places a job with the resources it was planned with, or not at all (left32, fix31a's residual).

A superuser may edit a queued job's gpus, gpu_memory_mb, cpu_milli and memory_mb (fix31a: the
admin locks the row and refuses once it is placed). A scheduler pass that read the job before
that edit committed, and claimed it after, placed it with its old count: one GPU index on a row
saying 2. Real parts: the scheduler's pass, two database connections (a thread) and the row
lock the admin's save takes; the edit's commit between the read and the claim is stood in for
by a ``post_init`` receiver on the scheduler's read of the queue (as in tests/portal/test_admin_writes.py)."""

from __future__ import annotations

import threading
import traceback

import pytest
from django.db import connection, transaction
from django.db.models.signals import post_init

from apps.jobs.models import GpuSlot, Job, JobState
from apps.jobs.services import job_claim
from apps.scheduling.loop import plan_and_start
from tests.jobs.factories import make_job


@pytest.mark.django_db
def test_a_job_whose_resources_were_edited_after_the_pass_read_it_is_not_placed_with_the_old_ones(bob, teams, node):
    job = make_job(team=teams["vision"], user=bob, gpus=1)
    edited = []

    def admin_edit_commits(sender, instance, **kwargs):
        if edited or instance.pk != job.pk:
            return
        if "_load" not in [frame.name for frame in traceback.extract_stack()]:  # the queue's read (inputs.QueueRows)
            return
        edited.append(Job.objects.filter(pk=job.pk).update(gpus=2, memory_mb=2048))

    post_init.connect(admin_edit_commits, sender=Job)
    try:
        plan_and_start()
    finally:
        post_init.disconnect(admin_edit_commits, sender=Job)

    assert edited == [1]
    job.refresh_from_db()
    assert (job.state, job.gpu_indices, GpuSlot.objects.count()) == (JobState.QUEUED, [], 0)

    assert plan_and_start()  # the next pass plans with what the row says
    job.refresh_from_db()
    assert (job.state, sorted(job.gpu_indices), job.gpus, job.memory_mb) == (JobState.STARTING, [0, 1], 2, 2048)


@pytest.mark.django_db(transaction=True)
def test_a_claim_waiting_on_the_admin_s_locked_row_refuses_once_the_edit_commits(bob, teams, node):
    """The scheduler's UPDATE meets the row the admin holds locked (select_for_update; SQLite: the
    write lock): it runs after the commit and must see the new count, on both databases."""
    job = make_job(team=teams["vision"], user=bob, gpus=1)
    planned = Job.objects.get(pk=job.pk)  # what the pass read
    claimed = []

    def scheduler():
        try:
            claimed.append(job_claim(planned, node=node, gpu_indices=[0], gpu_share=1.0, run_class="medium"))
        except Exception as exc:  # noqa: BLE001 (the assertion below says what)
            claimed.append(exc)
        finally:
            connection.close()

    claim = threading.Thread(target=scheduler)
    with transaction.atomic():
        locked = Job.objects.select_for_update().get(pk=job.pk, state=JobState.QUEUED)
        locked.gpus = 2
        locked.save(update_fields=["gpus"])
        claim.start()
        claim.join(1.0)  # it claims now (the old code) or waits for this transaction
    claim.join(30)

    assert not claim.is_alive() and claimed == [False]
    job.refresh_from_db()
    assert (job.state, job.gpus, job.gpu_indices, GpuSlot.objects.count()) == (JobState.QUEUED, 2, [], 0)
