"""Migrations jobs 0023–0025 (review24): the fill of ``Job.resume_chosen_attempt`` from the old
``resume_chosen_at``, and docs/deploy.md "Upgrades": ``manage.py migrate`` runs while the old web,
scheduler, workers and Slurm agent keep running ("Migrations are written so that step 2 is safe
with the old code still running: new columns are nullable or have defaults").

The old code is stood in for by the historical models of the migration it was written against
(the columns it SELECTs and INSERTs are exactly those): 0022 for the code before chain24, 0023
for the Slurm agent before "scancel once" (0024).
"""

from __future__ import annotations

import uuid

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from apps.jobs.models import Job

from .factories import make_job

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = ("jobs", "0022_jobevent_kind_recent")
FILLED = ("jobs", "0023_job_resume_chosen_attempt")


def latest() -> list:
    executor = MigrationExecutor(connection)
    return [key for key in executor.loader.graph.leaf_nodes() if key[0] == "jobs"]


def migrate(target) -> MigrationExecutor:
    executor = MigrationExecutor(connection)
    executor.migrate(target if isinstance(target, list) else [target])
    return executor


def models_at(target):
    return MigrationExecutor(connection).loader.project_state([target]).apps


@pytest.fixture
def back_at_0022(alice, teams):
    """Three jobs (running attempt 2, queued, starting), then the jobs tables as migration 0022
    left them; brought back up to date afterwards, whatever happened (the next tests need the
    whole schema)."""
    jobs = [job_row(alice, teams, state="running", attempt=2), job_row(alice, teams),
            job_row(alice, teams, state="starting")]
    migrate(BEFORE)
    try:
        yield models_at(BEFORE), jobs
    finally:
        migrate(latest())


def job_row(alice, teams, **fields) -> Job:
    return make_job(team=teams["vision"], user=alice, **fields)


def test_0023_fills_the_latest_chooser_as_the_old_fence_read_resume_chosen_at(alice, teams):
    """chain24's table: every row gets the answer the old fence gave (passes; run on PostgreSQL too)."""
    rows = {
        "running 3, chose": job_row(alice, teams, state="running", attempt=3),
        "running 2, not yet": job_row(alice, teams, state="running", attempt=2),
        "queued 2, stale choice": job_row(alice, teams, state="queued", attempt=2),
        "starting 4, stale choice": job_row(alice, teams, state="starting", attempt=4),
        "queued 1": job_row(alice, teams, state="queued", attempt=1),
    }
    migrate(BEFORE)
    try:
        old_job = models_at(BEFORE).get_model("jobs", "Job")
        now = timezone.now()
        for name in ("running 3, chose", "queued 2, stale choice", "starting 4, stale choice"):
            assert old_job.objects.filter(pk=rows[name].pk).update(resume_chosen_at=now) == 1
    finally:
        migrate(latest())
    chosen = {name: Job.objects.get(pk=job.pk).resume_chosen_attempt for name, job in rows.items()}
    assert chosen == {"running 3, chose": 3, "running 2, not yet": 1, "queued 2, stale choice": 1,
                      "starting 4, stale choice": 3, "queued 1": 0}


def test_0023_s_fill_leaves_the_ended_jobs_rows_alone(alice, teams):
    """docs/deploy.md: "A migration that must rewrite a big table says so in its docstring and in
    the release notes; run it in a maintenance window." 0023's first UPDATE rewrites every job row
    ever (``attempt >= 1``: all of them), in migrate's one transaction: on PostgreSQL a new version
    of each row and its index entries, and every row locked until it commits, while the old
    workers' heartbeats, check-ins and metric writes (the seq UPDATE of their job's row) wait for
    it. Only queued/starting/running rows matter to the fence (an ended job records nothing,
    whatever the number), a handful of the table.
    Failed before the lead fixed review24 (an ended job's row is written). Fix: ``.filter(state__in=("queued", "starting",
    "running"), attempt__gte=1)`` in the fill."""
    ended = [job_row(alice, teams, state=state, attempt=2)
             for state in ("succeeded", "failed", "cancelled", "timed_out")]
    migrate(BEFORE)
    migrate(latest())
    assert [Job.objects.get(pk=job.pk).resume_chosen_attempt for job in ended] == [0, 0, 0, 0]


def test_the_old_code_still_reads_and_updates_jobs_after_migrate(back_at_0022):
    """docs/deploy.md, Upgrades step 2: the old web, scheduler and workers keep running while
    ``migrate`` runs, and the workers are restarted one GPU server at a time after it. Migration
    0024 drops ``jobs_job.resume_chosen_at``, which every old process SELECTs with each job it
    reads (and whose old attempt_start / attempt_resume_choose write it): from the moment 0024 is
    applied until each process is restarted, every job read of the old code fails with "no such
    column" (heartbeats, check-ins, metric writes, the scheduler's pass, the web's pages).
    Failed before the lead fixed review24. Fix: drop the column from the model state only (SeparateDatabaseAndState, as
    apps/registry/migrations/0003 did for VersionCounter) and the column itself a release later."""
    old_apps, (job, _, _) = back_at_0022
    old_job = old_apps.get_model("jobs", "Job")
    migrate(latest())
    row = old_job.objects.get(pk=job.pk)  # any old-code job read: Job.objects.get(pk=...)
    assert row.attempt == 2
    assert old_job.objects.filter(pk=job.pk).update(resume_chosen_at=timezone.now()) == 1  # old attempt_resume_choose


def test_the_old_code_still_submits_jobs_once_0023_has_added_resume_chosen_attempt(back_at_0022):
    """The new column is NOT NULL with a default only in Django's model (not in the database):
    an INSERT by the old submit (which does not name the column) between migrate and the web's
    restart is refused (NOT NULL constraint failed: jobs_job.resume_chosen_attempt).
    Failed before the lead fixed review24. Fix: ``db_default=0`` (Django 5) on the field, or keep the column nullable."""
    old_apps, (_, template, _) = back_at_0022
    old_job = old_apps.get_model("jobs", "Job")
    migrate(FILLED)  # 0023 only: the old model's columns all still exist
    values = {f.attname: getattr(old_job.objects.get(pk=template.pk), f.attname)
              for f in old_job._meta.concrete_fields if not f.primary_key}
    values["spec_hash"] = uuid.uuid4().hex
    submitted = old_job.objects.create(**values)
    assert Job.objects.get(pk=submitted.pk).resume_chosen_attempt == 0


def test_the_old_slurm_agent_still_submits_placements_once_0025_has_added_the_scancel_columns(back_at_0022):
    """The same for ExecutorAttempt.scancel_reason (NOT NULL, no database default): the old agent's
    ``ExecutorAttempt.objects.create(...)`` in start_placed is refused, and it reads that
    IntegrityError as "already ours (or another agent's)": every placement of its partition stays
    unsubmitted, silently, until the agent is restarted.
    Failed before the lead fixed review24. Fix: ``db_default=""`` on scancel_reason (or null=True)."""
    _, (_, _, job) = back_at_0022
    migrate(FILLED)
    old_attempt = models_at(FILLED).get_model("jobs", "ExecutorAttempt")
    migrate(latest())
    record = old_attempt.objects.create(job_id=job.pk, attempt=job.attempt, attempt_id=job.attempt_id,
                                        executor="slurm")
    assert record.pk is not None


def chosen_by_the_old_code_after_the_fill(back_at_0022) -> tuple[Job, Job]:
    """The old worker running attempt 2 chooses its checkpoint (its attempt_resume_choose) once
    0023 has filled the new column, then the rest of the migrations run: (the job, the job as
    attempt 1's woken worker holds it)."""
    old_apps, (job, _, _) = back_at_0022
    old_job = old_apps.get_model("jobs", "Job")
    migrate(FILLED)
    # The old worker running attempt 2 chooses its checkpoint (its attempt_resume_choose).
    assert old_job.objects.filter(pk=job.pk, state="running").update(resume_chosen_at=timezone.now()) == 1
    migrate(latest())
    first = Job.objects.get(pk=job.pk)
    first.attempt, first.attempt_id = 1, uuid.uuid4()  # what attempt 1's woken worker holds
    return job, first


def test_a_choice_the_old_code_made_after_0023_s_fill_still_closes_the_fence(back_at_0022):
    """0023 fills resume_chosen_attempt once; an old worker that chooses after that (0024 runs
    moments later, the old workers run on until their server is restarted) writes only
    resume_chosen_at. Its running attempt 2 then reads as not chosen (resume_chosen_attempt = 1):
    attempt 1 — a woken stopped worker, say — records again onto the epochs attempt 2 is training,
    the chaos21 hazard the fence exists for, for as long as attempt 2 runs (and, through
    attempt_previous_stop's range, attempt 3 looks back at attempt 1 too).
    Failed before the lead fixed review24. Fix: while old code may run, the new code must read the old column too (or 0024
    re-fills from it before anything drops it, and old workers are kept from choosing after it:
    e.g. the release notes require the workers stopped before migrate)."""
    from apps.jobs.services import attempt_can_record

    _, first = chosen_by_the_old_code_after_the_fill(back_at_0022)
    assert not attempt_can_record(first)


def test_a_choice_the_old_code_made_still_closes_the_fence_once_its_attempt_is_requeued(back_at_0022):
    """review25: 2786901 reads the old mark (``resume_chosen_at``) only while the attempt that made
    it is RUNNING (``~Q(state=RUNNING, resume_chosen_at__isnull=False)``), and job_requeue leaves
    ``resume_chosen_attempt`` where the old worker could not move it. The rolling restart of
    docs/deploy.md step 3 requeues exactly those attempts (the old worker is stopped: killed, or
    lost when its server restarts; or the new scheduler preempts it): from the requeue until the
    next attempt chooses (queued, placed, waiting for GPUs, fetching inputs), attempt 1 — the woken
    stopped worker the fence exists for — records again onto the epochs attempt 2 trained.
    Failed before the lead fixed review25. Fix: job_requeue (the one place an attempt number grows) folds the old mark in,
    in the same UPDATE: ``resume_chosen_attempt=Case(When(state=RUNNING, resume_chosen_at__isnull=False,
    then=F("attempt")), default=F("resume_chosen_attempt"))`` (or attempt_may_record also reads a
    non-null ``resume_chosen_at`` on a queued/starting row as "attempt - 1 chose", which needs
    job_requeue to clear the mark for the attempts that had not chosen)."""
    from apps.jobs.services import attempt_can_record, job_requeue

    job, first = chosen_by_the_old_code_after_the_fill(back_at_0022)
    assert not attempt_can_record(first)  # 2786901's fix: closed while attempt 2 runs
    # Its server is restarted (step 3): the new code requeues attempt 2; the job waits as attempt 3.
    assert job_requeue(Job.objects.get(pk=job.pk), kind="requeued", reason="its worker was stopped")
    assert Job.objects.get(pk=job.pk).attempt == 3
    assert not attempt_can_record(first)


def test_the_next_attempt_waits_for_a_graceful_victim_that_chose_with_the_old_code(back_at_0022, node):
    """review25: the same gap in attempt_previous_stop. An old worker's attempt 2 chose (old mark
    only: resume_chosen_attempt stays 1), trains, and the new scheduler preempts it with a grace;
    attempt 3 starts (attempt_start clears the old mark) and looks only at attempt
    ``resume_chosen_attempt`` = 1, which was not preempted: no wait. Attempt 3 chooses before
    attempt 2's epoch end, and that epoch (trained in the grace, up to 900 s of GPU) is refused and
    trained again. Failed before the lead fixed review25 (returns None). Fix: the fold in job_requeue above."""
    from apps.jobs.services import attempt_preempt, attempt_previous_stop, attempt_start, job_claim

    old_apps, (job, _, _) = back_at_0022
    old_job = old_apps.get_model("jobs", "Job")
    migrate(FILLED)
    assert old_job.objects.filter(pk=job.pk, state="running").update(resume_chosen_at=timezone.now()) == 1
    migrate(latest())
    assert attempt_preempt(Job.objects.get(pk=job.pk), reason="an urgent job", now=timezone.now(), grace_s=300)
    queued = Job.objects.get(pk=job.pk)
    assert queued.attempt == 3
    assert job_claim(queued, node=node, gpu_indices=[1], gpu_share=1.0, run_class="medium")
    third = attempt_start(job_id=job.pk, attempt_id=Job.objects.get(pk=job.pk).attempt_id, node_name=node.name)
    assert third is not None
    stop = attempt_previous_stop(third, margin_s=15)
    assert stop is not None and stop.attempt == 2
