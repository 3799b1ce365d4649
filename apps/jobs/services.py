"""Writes about jobs: submit, cancel, state transitions, attempts, events, metrics, logs.

The only writer of Job state: the API, the portal, the scheduler loop (claim, dispatch,
preemption, reapers) and the worker (attempt start, check-in, checkpoints, outcome) all
call these functions and never update a Job row themselves.

Every state change is a conditional update (``UPDATE … WHERE state IN (expected)``) and
reports whether this caller won; nobody moves a job from a state it is no longer in.
"""

from __future__ import annotations

import json
import logging
import secrets
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core import signing
from django.db import DEFAULT_DB_ALIAS, IntegrityError, connection, connections, transaction
from django.db.models import Case, DurationField, ExpressionWrapper, F, Q, Value, When
from django.db.models.functions import Coalesce, Now
from django.utils import timezone

from apps.accounts.models import AuditEntry, Membership, Team
from apps.accounts.selectors import team_rows, team_rows_ahead
from apps.accounts.services import MANAGING_ROLES, actor_name, audit_prepare, audit_record
from apps.cluster.models import Node
from apps.core.artifacts import ArtifactKeyError, artifact_key
from apps.core.errors import FieldErrors
from apps.core.faults import fault_point
from apps.core.hashing import file_sha256
from apps.core.prepared import (
    PreparedInsert,
    PreparedRead,
    binds_on_server,
    reads_ahead,
    rows_insert,
    statement_cursor,
    value_preparer,
)
from apps.notifications.hooks import job_event_recorded
from apps.quotas.services import usage_charge
from apps.registry.selectors import model_name_task, model_name_task_ahead
from apps.registry.services import job_outputs_record, model_name_of
from apps.scheduling.admission import job_admission_errors
from apps.scheduling.kick import kick_scheduler, kick_scheduler_soon
from apps.scheduling.policy import JobRequest

from . import live
from .inputs import inputs_reads_ahead, inputs_resolve
from .models import (
    ACTIVE_STATES,
    HOLDING_STATES,
    SLOTS_PER_GPU,
    TERMINAL_STATES,
    Checkpoint,
    GpuSlot,
    Job,
    JobEvent,
    JobState,
    LogChunk,
    MetricPoint,
    PriorityClass,
)
from .paths import ansi_strip, public_text, public_value
from .selectors import job_may_requeue
from .spec import JobSpec, SpecError, parse_spec
from .spec_sweep import sweep_default_metric, sweep_metric_problem
from .weights import freeze_problem

log = logging.getLogger(__name__)


class DuplicateJob(Exception):
    def __init__(self, job: Job):
        self.job = job
        super().__init__(f"an identical job is already active: {job.id}")


class IdempotencyKeyReused(FieldErrors):
    """The caller's ``idempotency_key`` already made ``job`` from a different request; nothing was created."""

    def __init__(self, job: Job, *, visible: bool = True):
        self.job = job
        if not visible:  # a job of a team the caller has left: not even its id (sec19, F2)
            super().__init__({"idempotency_key": "was already used, for a job of a team you are no longer in; "
                                                 "send a new key"})
            return
        super().__init__({"idempotency_key": f"was already used for another request (job {job.id}); "
                                             "send a new key for a new request, or the same request to get that job"})


def job_visible_to(job: Job, user) -> bool:
    """Whether ``user`` may see ``job`` now (its team is one of theirs): memberships end."""
    return any(team.pk == job.team_id for team in team_rows(user=user))


def job_is_same_request(job: Job, spec: JobSpec, continued_from: dict | None = None) -> bool:
    """Whether ``spec`` asks for what ``job`` was submitted with: the same parsed spec, field for field.

    Not ``spec_hash``: that is what would *run* (duplicate detection), and leaves out
    task_name, priority, charge_to, timeout, retries, description…, any of which makes a new
    request. Parsed, not raw text, so a retry re-encoded (YAML ↔ JSON, key order, comments)
    is still the same request. Two things are left out: ``allow_duplicate`` (how to answer
    a conflict, not what the job is) and a sweep's ``seed`` when the request left it to be
    drawn (the stored one was drawn by the first submit).

    Only the fields both sides have are compared: a job stored before a field was added to
    JobSpec (``task_named``, ``requires``: derived from the same request text) is still the
    same request when a client retries it, unchanged, after an upgrade. The old server could
    not have stored a field it did not know, so nothing the request asked is left unchecked.
    A continuation (``continued_from``) is the same request only as a continuation of the same job.
    """
    asked = json.loads(json.dumps(spec.as_dict()))  # as the JSONField stores it (tuples → lists)
    stored = {key: value for key, value in job.spec.items() if key not in ("resolved", "inputs")}
    if stored.pop("continued_from", None) != continued_from:
        return False
    asked = {key: value for key, value in asked.items() if key in stored}
    # A val left without data= is stored with the dataset its model was trained on filled in
    # (apps.jobs.inputs._data_of_model, said in inputs.data.chosen); a retry is compared before that
    # fill, so without it: it was "another request", a 409 for `yoloq submit`'s retry (review31).
    chosen = (((job.spec.get("inputs") or {}).get("data") or {}).get("chosen"))
    if chosen and "data" not in (asked.get("train_args") or {}) and isinstance(stored.get("train_args"), dict):
        stored["train_args"] = {key: value for key, value in stored["train_args"].items() if key != "data"}
    for document in (asked, stored):
        document.pop("allow_duplicate", None)
    if asked.get("sweep") and asked["sweep"].get("seed") is None and stored.get("sweep"):
        asked["sweep"] = {**asked["sweep"], "seed": stored["sweep"].get("seed")}
    return asked == stored


class TooManyActiveJobs(Exception):
    """The user already has ``limit`` queued or running jobs (MAX_ACTIVE_JOBS_PER_USER)."""

    def __init__(self, count: int, limit: int):
        self.count, self.limit = count, limit
        super().__init__(f"you have {count} active (queued, starting or running) jobs; the limit is {limit} "
                         "per user: wait for some to finish or cancel some")


# --- sequence numbers, events ------------------------------------------------------------


def seq_allocate(job_id, count: int = 1, *, where: Q | None = None) -> int | None:
    """Reserve ``count`` sequence numbers for the job; returns the first.

    ``where``: only while the job's row matches it, else None and nothing is reserved (the
    attempt fence of :func:`metrics_record`, checked in the update it needs anyway).
    """
    with transaction.atomic():
        if not Job.objects.filter(where or Q(), pk=job_id).update(seq=F("seq") + count):
            return None
        last = Job.objects.filter(pk=job_id).values_list("seq", flat=True).get()
    return last - count + 1


def attempt_may_record(job: Job) -> Q:
    """The job rows on which ``job``'s attempt (``job.attempt_id``) may still write metrics,
    checkpoints, log output and live progress: it is the current running attempt, or it was
    requeued and no attempt after it has chosen its checkpoint yet (the job queued, only placed,
    or running but still waiting for its GPUs, fetching inputs or for this attempt to stop:
    ``resume_chosen_attempt`` is the latest attempt that chose, :func:`attempt_resume_choose`).

    The second case is graceful preemption: the victim's epoch-end checkpoint is recorded
    after its requeue, by design, and the next attempt resumes from it (review22, 4: fencing
    on "started" refused it while the next attempt had not picked its resume point yet). An
    attempt preempted in turn before it chose trained nothing: the one after it is the victim's
    next attempt (review23, 12: the chain refused the victim's epoch end, and it was trained again).
    Once a later attempt has chosen, whatever the old one still reports (a worker that was
    stopped and woke up, a preempted child finishing its epoch late) is another attempt's
    past, not the job's: it would land on the new attempt's rows of the same epochs (chaos21).

    ``resume_chosen_at`` (the previous release's mark: the running attempt chose) closes the fence
    too, for one release: a worker of that release still running during ``migrate`` (docs/deploy.md,
    Upgrades) marks only it (review24, 3). This release writes both.
    """
    return (Q(attempt_id=job.attempt_id, state=JobState.RUNNING)
            | (Q(attempt__gt=job.attempt, resume_chosen_attempt__lte=job.attempt,
                 state__in=[JobState.QUEUED, JobState.STARTING, JobState.RUNNING])
               & ~Q(state=JobState.RUNNING, resume_chosen_at__isnull=False)))


def attempt_resume_choose(job: Job) -> bool:
    """The running attempt ``job.attempt_id`` is about to choose the checkpoint it resumes from:
    from here on no attempt before it records anything more (:func:`attempt_may_record`).

    Written *before* the checkpoints are read: a row a previous attempt records is either
    committed before this update (and read by the choice) or refused after it, under the job
    row's lock (checkpoint_record) or in the seq update (metrics). False if the attempt is no
    longer current.
    """
    return Job.objects.filter(pk=job.pk, attempt_id=job.attempt_id, state=JobState.RUNNING).update(
        resume_chosen_attempt=F("attempt"), resume_chosen_at=timezone.now()) == 1


def attempt_row_refused(job: Job, what: str) -> None:
    log.warning("job %s: %s of attempt %s refused: a later attempt has chosen its checkpoint (or the job ended)",
                job.pk, what, job.attempt, extra={"job_id": str(job.pk)})


def job_event(job: Job, kind: str, message: str = "", data: dict | None = None, *,
              said: Sequence[str] = ()) -> JobEvent:
    # Events are read by the team: team-relative names only (apps.jobs.paths), but for what a
    # person typed for them (``said``, an operator's drain reason: optrial24, F5), kept as typed
    # and named in the data so that readers scrubbing again keep it too (JobEvent.public_message).
    said = [part for part in said if part]
    message = public_text(message, job=job, said=said)
    data = public_value({key: value for key, value in (data or {}).items() if key != JobEvent.SAID}, job=job)
    if said:
        data[JobEvent.SAID] = said
    seq = seq_allocate(job.pk)
    event = JobEvent.objects.create(
        job_id=job.pk, seq=seq, attempt=job.attempt, kind=kind, message=message, data=data or {}
    )
    state, priority_class, run_class = (Job.objects.filter(pk=job.pk).values_list("state", "priority_class", "run_class")
                                        .first() or (None, None, None))
    # After commit: many events are written inside the transaction of their state change. The
    # classes ride along: the job page says "runs as high: beyond the team's urgent allowance" when
    # the scheduler placed an urgent job as high (trial31: only after a reload).
    live.publish_on_commit(job.pk, {"type": "status", "seq": seq, "job": str(job.pk),
                                    "data": {"state": state, "kind": kind, "message": message,
                                             "attempt": job.attempt, "priority_class": priority_class,
                                             "run_class": run_class}})
    job_event_recorded(job_id=job.pk, kind=kind, event_id=event.pk)  # notifications, after commit
    return event


# --- transitions ----------------------------------------------------------------------------


def job_transition(job_id, *, expected: Iterable[str], to: str, attempt_id=None, planned: dict[str, Any] | None = None,
                   **fields: Any) -> bool:
    """Move a job to ``to`` if it is in one of ``expected`` (and on ``attempt_id``, and its
    ``planned`` fields still hold those values). True if we won.

    A final state frees the attempt's GPU slots in the same transaction, and forgets the queue's
    answers (position, ETAs, the reason it waited): a job cancelled in the queue still read "Why
    it waits: …; expected 18:09" on its page and in the API (manager trial 15, F22).
    """
    query = Job.objects.filter(pk=job_id, state__in=list(expected))
    if attempt_id is not None:
        query = query.filter(attempt_id=attempt_id)
    if planned:
        query = query.filter(**planned)
    now = timezone.now()
    if to not in TERMINAL_STATES:
        return query.update(state=to, **fields) == 1
    fields.setdefault("finished_at", now)
    fields.setdefault("queue_position", None)
    fields.setdefault("estimated_start_at", None)
    fields.setdefault("estimated_start_low_at", None)
    fields.setdefault("estimated_start_high_at", None)
    fields.setdefault("reason", "")
    with transaction.atomic():
        moved = query.update(state=to, **fields) == 1
        if moved:
            GpuSlot.objects.filter(job_id=job_id).delete()
    return moved


def job_requeue(
    job: Job, *, reason: str, kind: str = "requeued", by=None, retry: bool = False, data: dict | None = None,
    charge_at: datetime | None = None, said: Sequence[str] = (),
) -> bool:
    """Put a starting/running job back in the queue; True if this call did (the attempt was current).

    An attempt that had started (``running``) ends here and the job comes back as attempt N+1.
    One that was only allocated (``starting``: never delivered, or refused) is not an attempt
    yet: it keeps its number and only gets a new ``attempt_id``, which fences off the stale
    delivery. Decided in the same conditional update, so a worker's fenced start racing
    this requeue is counted exactly when it won. (A requeue of a never-started placement on
    a node that died meanwhile used to cost a whole attempt: one fault, two attempts.)

    Not charged as a retry unless ``retry``: then the same conditional update also takes one
    of ``retries_left`` (``retries_left > 0`` is part of the condition), so a retry is never
    spent without its requeue, nor twice for one attempt.

    ``charge_at`` (and any person's requeue, ``by``): the ended attempt's GPU time is charged up
    to then in the same transaction, from the row as the update finds it (locked), not from
    ``job``: a ``job`` read while its placement was ``starting`` may have started since, and
    charging that stale copy (no ``started_at``) charged nothing for an attempt that ran.

    ``said``: the parts of ``reason`` a person typed, kept as typed in the event (:func:`job_event`).
    """
    # A sweep parent runs no attempt: requeued, the scheduler would try to place it.
    query = Job.objects.filter(pk=job.pk, state__in=HOLDING_STATES, attempt_id=job.attempt_id, is_sweep=False)
    spend = {}
    if retry:
        query = query.filter(retries_left__gt=0)
        spend = {"retries_left": F("retries_left") - 1}
    before = job.attempt
    if by is not None:
        # A person's requeue ends the attempt here, and its fenced worker charges nothing: the
        # GPU time it held was never in the ledger (once per attempt: a preemption that charged
        # it already is not charged twice).
        charge_at = charge_at or timezone.now()
    with transaction.atomic():
        ending = query.select_for_update().first() if charge_at is not None else None
        if ending is not None:
            usage_charge(ending, ended_at=charge_at)
        moved = query.update(
            **spend,
            state=JobState.QUEUED,
            attempt=Case(When(state=JobState.RUNNING, then=F("attempt") + 1), default=F("attempt"),
                         output_field=Job._meta.get_field("attempt")),
            attempt_id=uuid.uuid4(),
            # A running attempt the previous release's worker let choose marked only resume_chosen_at
            # (cleared at the next start): its choice is kept in the number (review25, 2).
            resume_chosen_attempt=Case(When(state=JobState.RUNNING, resume_chosen_at__isnull=False, then=F("attempt")),
                                       default=F("resume_chosen_attempt"),
                                       output_field=Job._meta.get_field("resume_chosen_attempt")),
            node=None,
            gpu_indices=[],
            dispatched_at=None,
            started_at=None,
            heartbeat_at=None,
            queued_at=timezone.now(),
        )
        if moved:  # the old attempt's slots go with it, started or not
            GpuSlot.objects.filter(job_id=job.pk, attempt_id=job.attempt_id).delete()
            job.refresh_from_db()
            started = job.attempt != before
            if not started:
                reason = f"{reason}; attempt {job.attempt} had not started, so it keeps its number"
            fault_point("job_requeue")
            # The ended attempt's number and whether it had started: attempt_lost counts these, so
            # the event is written with the requeue or not at all (a scheduler killed between the
            # two left a lost attempt MAX_LOST_ATTEMPTS never counted).
            job_event(job, kind, reason, {"ended_attempt": before, "attempt_started": started, **(data or {})},
                      said=said)
            if by is not None:
                audit_record(actor=by, action=AuditEntry.Action.JOB_REQUEUE, team=job.team_id, target=job,
                             message=reason)
    if moved:
        kick_scheduler()
    return bool(moved)


# --- the scheduler's side of an attempt -------------------------------------------------------


# What a placement is sized by: a claim places the job only while its row still says what it was
# planned with (job_claim).
CLAIM_RESOURCE_FIELDS = ("gpus", "gpu_memory_mb", "cpu_milli", "memory_mb")


class SlotTaken(Exception):
    """A GPU slot the claim needs is held by another attempt."""


def job_claim(job: Job, *, node, gpu_indices: list[int], gpu_share: float, run_class: str) -> bool:
    """Allocate a queued job to ``node`` (queued → starting) as its current attempt, with its
    GPU slots, in one transaction. True if we won.

    False, with nothing written, if the job is no longer queued on that attempt, its resources
    are no longer the ones ``job`` was planned with, or a slot is held by another attempt
    (another scheduler got there first, or the plan was stale): the unique (node, GPU, slot)
    constraint decides, whatever the isolation level.

    The resources are part of the conditional update (``CLAIM_RESOURCE_FIELDS``): a superuser's
    admin edit of a queued job's gpus/memory commits on the locked row (fix31a), and a pass that
    read the job before that commit and claims after it would otherwise place it with the old
    count (one GPU index on a row saying 2). The UPDATE's own WHERE compares them on the row as
    it is once the admin's lock is released (PostgreSQL re-checks it on the newest row version;
    SQLite's write lock orders the two): a mismatch is a lost claim, and the next pass replans.
    """
    try:
        with transaction.atomic():
            if not job_transition(
                job.pk, expected=[JobState.QUEUED], to=JobState.STARTING, attempt_id=job.attempt_id,
                planned={name: getattr(job, name) for name in CLAIM_RESOURCE_FIELDS},
                node=node, gpu_indices=list(gpu_indices), gpu_share=gpu_share, run_class=run_class,
                dispatched_at=None, queue_position=None, reason="", estimated_start_at=None,
                estimated_start_low_at=None, estimated_start_high_at=None,
            ):
                return False
            gpu_slots_take(job, node=node, gpu_indices=gpu_indices, gpu_share=gpu_share)
    except (SlotTaken, IntegrityError) as exc:
        log.warning("claim of job %s on %s GPU %s refused: %s", job.pk, node.name, list(gpu_indices), exc,
                    extra={"job_id": str(job.pk), "node": node.name})
        return False
    return True


def slots_needed(gpu_share: float) -> int:
    """Slots of each GPU an attempt holds: all of them for whole GPUs, else its share of them."""
    if gpu_share >= 1:
        return SLOTS_PER_GPU
    count = gpu_share * SLOTS_PER_GPU
    if count < 1 or abs(count - round(count)) > 1e-9:
        raise ValueError(f"a GPU share of {gpu_share:g} is not a whole number of 1/{SLOTS_PER_GPU} slots")
    return round(count)


def gpu_slots_take(job: Job, *, node, gpu_indices: list[int], gpu_share: float) -> None:
    """Insert the attempt's slot rows: the lowest free slots of each GPU (SlotTaken if too few)."""
    need = slots_needed(gpu_share)
    taken = set(GpuSlot.objects.filter(node=node, gpu_index__in=list(gpu_indices))
                .values_list("gpu_index", "slot"))
    rows = []
    for index in gpu_indices:
        free = [slot for slot in range(SLOTS_PER_GPU) if (index, slot) not in taken][:need]
        if len(free) < need:
            raise SlotTaken(f"GPU {index} has {SLOTS_PER_GPU - sum(1 for i, _ in taken if i == index)} of "
                            f"{SLOTS_PER_GPU} slots free; the attempt needs {need}")
        rows += [GpuSlot(node=node, gpu_index=index, slot=slot, job_id=job.pk, attempt_id=job.attempt_id)
                 for slot in free]
    GpuSlot.objects.bulk_create(rows)


def job_dispatched(job: Job, *, at: datetime) -> bool:
    """The attempt was handed to its node's queue at ``at`` (the repair step reads this)."""
    return Job.objects.filter(pk=job.pk, attempt_id=job.attempt_id).update(dispatched_at=at) == 1


QUEUE_INFO_CHUNK = 500  # rows per transaction: how long one chunk holds SQLite's write lock


def job_queue_info_set(updates: Sequence[tuple[Any, dict[str, Any]]]) -> int:
    """Store the planner's view of waiting jobs: ``(job pk, {field: value})`` pairs (position,
    ETA, reason, priority score, factors: ``QUEUE_INFO_FIELDS``, or some of them).

    Only a queued row is written: a job cancelled or started meanwhile keeps its own fields.
    One start or arrival ahead shifts every position behind it, so a long queue's pass
    rewrites most rows: one ``.filter(...).update(...)`` each compiled its SQL anew (~1 ms of
    CPU a row, seconds per pass at 10,000 queued). Here one UPDATE is written per set of
    fields and run for all its rows (``executemany``; on PostgreSQL one ``UPDATE … FROM
    (VALUES …)`` per chunk), values converted as the ORM's
    ``update()`` converts them (``get_db_prep_save``, through ``core.prepared.value_preparer``),
    ``QUEUE_INFO_CHUNK`` rows per transaction so a submit waits for SQLite's write lock at
    most one chunk. Returns the rows written.
    """
    if not updates:
        return 0
    # The connection itself, not the ``django.db.connection`` proxy: every attribute read
    # through the proxy is a thread-local lookup, and the conversions below read it ~10 times
    # a row (a quarter of the write's CPU at 10,000 rows).
    conn = connections[DEFAULT_DB_ALIAS]
    meta = Job._meta
    qn = conn.ops.quote_name
    pk_prep, queued = meta.pk.get_db_prep_value, str(JobState.QUEUED)
    by_fields: dict[tuple[str, ...], list] = {}
    for pk, values in updates:
        by_fields.setdefault(tuple(values), []).append((pk, values))
    table, pk_column, state = qn(meta.db_table), qn(meta.pk.column), qn(meta.get_field("state").column)
    written = 0
    for names, rows in by_fields.items():
        fields = [meta.get_field(name) for name in names]
        preps = [value_preparer(field, conn) for field in fields]
        params = [[*(prep(values[name]) for name, prep in zip(names, preps, strict=True)), pk_prep(pk, conn)]
                  for pk, values in rows]
        columns = [qn(field.column) for field in fields]
        for at in range(0, len(params), QUEUE_INFO_CHUNK):
            chunk = params[at:at + QUEUE_INFO_CHUNK]
            with transaction.atomic(), conn.cursor() as cursor:
                if conn.vendor == "postgresql":
                    # One statement per chunk: PostgreSQL parses and plans each statement of an
                    # executemany (10,000 rows: 2.3 s, this 1.1 s, of which most is the rows'
                    # new index entries).
                    row = f"({', '.join(f'%s::{f.db_type(conn)}' for f in (*fields, meta.pk))})"
                    cursor.execute(
                        f"UPDATE {table} SET {', '.join(f'{c} = v.c{i}' for i, c in enumerate(columns))} "
                        f"FROM (VALUES {', '.join([row] * len(chunk))}) "
                        f"AS v({', '.join(f'c{i}' for i in range(len(columns)))}, pk) "
                        f"WHERE {table}.{pk_column} = v.pk AND {table}.{state} = %s",
                        [value for row_params in chunk for value in row_params] + [queued])
                else:
                    cursor.executemany(f"UPDATE {table} SET {', '.join(f'{c} = %s' for c in columns)} "
                                       f"WHERE {pk_column} = %s AND {state} = %s",
                                       [[*row_params, queued] for row_params in chunk])
                written += max(cursor.rowcount, 0)
    return written


class JobClassRefused(Exception):
    """Why a job's class was not changed. ``field`` is ``"priority_class"`` (a class that does not
    exist), ``"state"`` (the job is not queued) or None (the caller may not: a 403)."""

    def __init__(self, field: str | None, message: str):
        super().__init__(message)
        self.field, self.message = field, message


def job_class_change(job: Job, *, priority_class: str, by) -> bool:
    """A manager moves a queued job, or an active sweep, to another class: the rules of the API,
    the job page and the CLI. A sweep's class is its queued trials' and its later trials'.

    True if the class changed (the scheduler is kicked to replan), False if the job already has
    it; raises :class:`JobClassRefused` saying why not. (Admin's bulk actions report per row.)
    """
    if not job_may_requeue(user=by, job=job):
        raise JobClassRefused(None, "only a manager of the job's team may change its class")
    if priority_class not in PriorityClass.values:
        raise JobClassRefused("priority_class", f"must be one of {', '.join(PriorityClass.values)}, "
                                                f"got {str(priority_class)[:50]!r}")
    if job.is_sweep and job.state not in ACTIVE_STATES:
        raise JobClassRefused("state", f"the sweep is {job.state}; it submits no more trials")
    if not job.is_sweep and job.state != JobState.QUEUED:
        raise JobClassRefused("state", f"the job is {job.state}; only a queued job changes class")
    if job.priority_class == priority_class:
        return False
    if not job_class_set(job, priority_class=priority_class, by=by):
        raise JobClassRefused("state", "the sweep ended meanwhile; class not changed" if job.is_sweep
                              else "the job left the queue meanwhile; class not changed")
    kick_scheduler()
    return True


def job_class_set(job: Job, *, priority_class: str, by) -> bool:
    """A manager moves a queued job, or an active sweep, to another priority class (audited as
    ``job.class``, with the class before). A sweep's queued trials move with it (each with its
    event; the sweep's audit entry lists them) and its later trials are submitted in it
    (apps.sweeps.services.trial_document reads the sweep's class; manager trial 15, F23)."""
    before = job.priority_class
    movable = (JobState.QUEUED,) if not job.is_sweep else ACTIVE_STATES
    changed = Job.objects.filter(pk=job.pk, state__in=movable).update(priority_class=priority_class) == 1
    trials = []
    if changed and job.is_sweep:
        queued = Job.objects.filter(parent_id=job.pk, state=JobState.QUEUED).exclude(priority_class=priority_class)
        trials = [trial for trial in queued.order_by("created_at")
                  if Job.objects.filter(pk=trial.pk, state=JobState.QUEUED).update(priority_class=priority_class)]
    if changed:
        message = f"priority class set to {priority_class} by {by.username}"
        job_event(job, "class_changed", message + (f" (and of its {len(trials)} queued trials)" if trials else ""))
        for trial in trials:
            job_event(trial, "class_changed", f"{message} with its sweep {job.task_name}")
        data: dict[str, Any] = {"from": before, "to": priority_class}
        if job.is_sweep:
            data["trials"] = [str(t.pk) for t in trials]
        audit_record(actor=by, action=AuditEntry.Action.JOB_CLASS, team=job.team_id, target=job,
                     message=f"{before} → {priority_class}", data=data)
    return changed


def attempt_preempt(job: Job, *, reason: str, now: datetime, grace_s: float = 0.0, by=None,
                    said: Sequence[str] = ()) -> bool:
    """Take a running attempt's GPUs for another job: charge what it used, requeue it (not a retry).

    The victim's worker notices at its next check-in that the attempt is no longer current
    (fencing). With ``grace_s`` it lets the training stop at the end of its current epoch
    (:func:`attempt_stop_grace`), killing it only after ``grace_s``; without, it stops the
    process tree at once. The checkpoint carries the work over. The event names the node and
    GPUs it keeps meanwhile: an attempt placed on them waits that long (:func:`gpus_stopping_left_s`).
    """
    usage_charge(job, ended_at=now)
    data = {"attempt": job.attempt, "attempt_id": str(job.attempt_id), "grace_s": grace_s}
    if grace_s > 0 and job.node_id is not None:
        # Which worker may still report the victim's epoch end: its next attempt stops waiting for it
        # once that node is lost or its worker replaced (attempt_previous_stop).
        node, worker_pid = Node.objects.filter(pk=job.node_id).values_list("name", "worker_pid").first() or ("", None)
        # ...and which GPUs it keeps until then: an attempt placed on them waits (gpus_stopping_left_s).
        data.update(node=node, worker_pid=worker_pid, gpu_indices=list(job.gpu_indices or []))
    return job_requeue(job, reason=f"preempted: {reason}", kind="preempted", by=by, data=data, said=said)


def job_evacuate(job: Job, *, node_name: str, reason: str, by, now: datetime | None = None) -> bool:
    """Take a starting/running job off a node an operator drains ("drain and requeue", trial 14, F6).

    The preemption path: its GPU time so far is charged, it stops at its next epoch end (killed
    after the scheduler configuration's ``preempt_grace_s``) and comes back queued to resume from
    its checkpoint, not counted as a retry; audited as a requeue by ``by``. True if this call did
    (False: it was no longer on its attempt, or a cancel is already stopping it).
    """
    from apps.scheduling.models import SchedulerConfig

    if job.is_sweep or job.cancel_requested_at is not None:
        return False
    grace_s = SchedulerConfig.current().preempt_grace_s
    return attempt_preempt(job, reason=f"node {node_name} is drained by {by.get_username()} ({reason}); "
                                       f"resumes from its checkpoint",
                           now=now or timezone.now(), grace_s=grace_s, by=by, said=[reason])


def attempt_preemption(job: Job, *, attempt_id=None) -> JobEvent | None:
    """The ``preempted`` requeue of the attempt ``attempt_id`` (default ``job.attempt_id``), or None.

    Matched on the attempt's id, not its number: a requeue of an attempt that never started
    keeps the number (job_requeue), and a later fence of that number must not inherit a grace.
    """
    return (JobEvent.objects.filter(job_id=job.pk, kind="preempted", data__attempt_id=str(attempt_id or job.attempt_id))
            .order_by("-seq").first())


def preemption_grace_s(event: JobEvent | None) -> float:
    """The grace a ``preempted`` event gave its attempt to reach its epoch end (0: none, or no event)."""
    return float((event.data or {}).get("grace_s") or 0.0) if event else 0.0


def attempt_stop_grace(job: Job) -> float:
    """Seconds a fenced attempt may take to reach its epoch end: the grace of its preemption, else 0."""
    return preemption_grace_s(attempt_preemption(job))


def attempt_stop_by(job: Job) -> datetime | None:
    """Until when the fenced attempt ``job.attempt_id`` may go on to its epoch end: its preemption's
    time plus its grace. None when it was not preempted with a grace, or a cancel of the job was
    asked since (a person's cancel stops every attempt at once).

    What a Slurm victim is held to (its relay hears "preempted", then "fenced": :func:`attempt_report`;
    the agent scancels it after this plus a margin); a local worker counts the same grace itself.
    """
    event = attempt_preemption(job)
    grace_s = preemption_grace_s(event)
    if grace_s <= 0 or Job.objects.filter(pk=job.pk, cancel_requested_at__isnull=False).exists():
        return None
    return event.created_at + timedelta(seconds=grace_s)


@dataclass(frozen=True)
class PreviousStop:
    """A gracefully preempted previous attempt that may still be finishing its epoch
    (:func:`attempt_previous_stop`)."""

    attempt: int
    preempted_seq: int  # its ``preempted`` event
    left_s: float  # the longest still to wait, from now: never more than its grace plus the margin
    node: str  # where it runs ('' when not recorded)
    worker_pid: int | None  # the worker that ran it there (None: not recorded, or a Slurm node)


def attempt_previous_stop(job: Job, *, margin_s: float) -> PreviousStop | None:
    """What ``job``'s current attempt waits for, before choosing its checkpoint: the attempt before
    it that may still record (:func:`attempt_may_record`), gracefully preempted and not yet stopped
    at its epoch end; None when there is nothing to wait for.

    That is the latest attempt that chose its checkpoint (``resume_chosen_attempt``): the attempt
    before this one, or, when that one was preempted in turn before it chose, the one before it
    (an attempt that never chose trained nothing, so there is nothing to wait for: review23, 12;
    review24, 5). It is waited for when it was requeued by a graceful preemption (a ``preempted``
    requeue of that started attempt, with a ``grace_s``), has not reported its end
    (``attempt_stopped``, written by the worker's or Slurm agent's ``attempt_finish`` once the child
    has stopped, the epoch's metrics, checkpoint and output recorded before) and still can
    (:func:`attempt_previous_stopped`). At most until that preemption's time plus its grace (after
    which the old worker kills its child) plus ``margin_s`` (its check-in and kill delay);
    ``left_s`` is that, counted on the database's clock (:func:`event_age`), never more than the
    grace plus the margin: neither a worker's clock behind the scheduler's (review23) nor one ahead
    of it (it waited that much less) changes the wait. A crash, a lost node, a retry, a person's
    requeue or a preemption without grace: None.
    """
    # 0: no attempt of this job chose, so none trained (review25, 3). A choice the previous release's
    # worker made is folded into the number when its attempt is requeued (job_requeue).
    chosen = Job.objects.filter(pk=job.pk).values_list("resume_chosen_attempt", flat=True).first() or 0
    if not 1 <= chosen < job.attempt:
        return None
    preempted = (JobEvent.objects.filter(job_id=job.pk, kind="preempted", data__ended_attempt=chosen,
                                         data__attempt_started=True)
                 .order_by("-seq").only("job_id", "created_at", "data", "seq").annotate(age=event_age()).first())
    left = preempted_attempt_left_s(preempted, margin_s=margin_s) if preempted else None
    if left is None:
        return None
    data = preempted.data or {}
    stop = PreviousStop(attempt=chosen, preempted_seq=preempted.seq, left_s=left,
                        node=str(data.get("node") or ""), worker_pid=data.get("worker_pid"))
    return None if previous_node_gone(stop) else stop


def event_age() -> ExpressionWrapper:
    """An events query's annotation ``age``: the time since each event's ``created_at``, on the
    database's clock (``created_at`` is the writing process's clock: the scheduler's, for a
    preemption). A worker measuring it on its own clock waited less by as much as that clock was
    ahead (a victim still finishing its epoch then shared its GPU), more by as much as it was
    behind (review23); the database's clock is the server's, as the scheduler's is."""
    return ExpressionWrapper(Now() - F("created_at"), output_field=DurationField())


def preempted_attempt_left_s(event: JobEvent, *, margin_s: float) -> float | None:
    """How long from now the attempt a ``preempted`` event ended may still run to its epoch end
    (holding its GPUs, recording its last epoch): the preemption's time plus its grace (then its
    worker kills it) plus ``margin_s``, less the time since (``event.age``: read with
    :func:`event_age`, on the database's clock) — never more than the grace plus the margin
    (review23), at least 0. None when it cannot: a preemption without grace, of an attempt that had
    not started, or one that reported its stop (``attempt_stopped``, written once its child
    stopped, the epoch's rows recorded before)."""
    data = event.data or {}
    grace_s = preemption_grace_s(event)
    if grace_s <= 0 or data.get("attempt_started") is not True or preempted_attempt_stopped(event):
        return None
    bound = grace_s + margin_s
    return max(0.0, min(bound, bound - event.age.total_seconds()))


def preempted_attempt_stopped(event: JobEvent) -> bool:
    """The attempt a ``preempted`` event ended has reported its stop since."""
    return attempt_stopped_since(event.job_id, attempt=(event.data or {}).get("ended_attempt"), seq=event.seq)


def attempt_stopped_since(job_id, *, attempt, seq: int) -> bool:
    """``attempt`` of the job wrote ``attempt_stopped`` (its child has stopped) after event ``seq``."""
    return JobEvent.objects.filter(job_id=job_id, kind="attempt_stopped", attempt=attempt, seq__gt=seq).exists()


def previous_stop_wait_said(job: Job, stop: PreviousStop, *, before: str) -> None:
    """The timeline's word that ``job``'s attempt waits for ``stop`` (``before``: what it waits to do)."""
    if stop.left_s > 0:
        job_event(job, "waiting_for_previous_attempt",
                  f"attempt {stop.attempt} was preempted and may still be finishing its epoch: waiting up to "
                  f"{stop.left_s:.0f} s for it to stop before {before}", {"attempt": stop.attempt})


def previous_stop_silent_said(job: Job, attempt: int) -> None:
    """The timeline's word that the preempted ``attempt`` never reported its stop within its grace."""
    job_event(job, "previous_attempt_silent", f"attempt {attempt} did not report its stop within its preemption "
                                              f"grace; resuming from the checkpoints recorded so far",
              {"attempt": attempt})


def attempt_previous_stopped(job: Job, stop: PreviousStop) -> bool:
    """The preempted attempt ``stop`` reported its stop, or nothing of it can any more
    (:func:`previous_node_gone`)."""
    return attempt_stopped_since(job.pk, attempt=stop.attempt, seq=stop.preempted_seq) or previous_node_gone(stop)


def previous_node_gone(stop: PreviousStop) -> bool:
    """Nothing of the preempted attempt ``stop`` can report any more: its node is stopping or lost
    (a drained node's worker stopped for maintenance kills its trainings, whose work-horses die with
    them: their next attempt waited out the whole grace, its GPUs idle and charged, review23), gone,
    or run by another worker than the one that ran it."""
    if not stop.node:
        return False
    node = Node.objects.filter(name=stop.node).values_list("state", "worker_pid").first()
    if node is None:
        return True
    state, worker_pid = node
    return state in (Node.State.STOPPING, Node.State.LOST) or (
        stop.worker_pid is not None and worker_pid != stop.worker_pid)


def infra_requeues_left(job: Job) -> bool:
    """May the attempt still end in a requeue that is not counted as a retry (a killed training, a
    node that lost the shared storage)? At most ``MAX_INFRA_REQUEUES`` beyond the retries."""
    return job.attempt <= job.retries_left + MAX_INFRA_REQUEUES


def gpus_stopping_left_s(*, node_name: str, gpu_indices: list[int], margin_s: float) -> float:
    """Seconds from now that an attempt gracefully preempted on any of ``gpu_indices`` of node
    ``node_name`` may still hold them: the longest of its preemption's time plus its grace (then
    its worker kills it) plus ``margin_s``, less the time since; 0 when none may.

    None that has reported its stop (``attempt_stopped``) counts, nor a preemption without
    grace or of an attempt that had not started. At most each one's grace plus ``margin_s``,
    whatever this machine's clock says (counted on the database's: :func:`event_age`).
    Preemptions are looked up as far back as a victim may still run the grace it was given:
    the scheduler configuration's ``preempt_grace_s``, or the longer one it replaced while that
    may still run (``SchedulerConfig.grace_lookback_s``, on the database's clock; a grace lowered
    since was not waited out, though the victim's worker still gave it the longer one, and the two
    trainings shared a GPU).
    Read once per busy GPU lock, not in a loop, through the events' (kind, created_at) index.
    """
    from apps.scheduling.models import SchedulerConfig

    # The lowering's age on the database's clock too: the admin's process wrote its time, and a
    # worker's clock ahead stopped looking back that much early (review30).
    config = SchedulerConfig.objects.annotate(db_now=Now()).order_by("pk").first()
    lookback_s = (config.grace_lookback_s(now=config.db_now, margin_s=margin_s) if config is not None
                  else SchedulerConfig.current().preempt_grace_s)
    horizon = Now() - timedelta(seconds=lookback_s + margin_s)
    wanted = set(gpu_indices)
    left = 0.0
    for event in (JobEvent.objects.filter(kind="preempted", created_at__gte=horizon, data__node=node_name)
                  .only("job_id", "seq", "data", "created_at").annotate(age=event_age())):
        if wanted & set((event.data or {}).get("gpu_indices") or []):
            left = max(left, preempted_attempt_left_s(event, margin_s=margin_s) or 0.0)
    return left


def attempt_lost(job: Job, *, reason: str, now: datetime) -> str:
    """An attempt died with its infrastructure (node silent, monitor silent): requeue it, not
    counted as a retry (a new attempt only if it had started), or cancel it if that was asked,
    so a cancel always ends. Returns requeued | cancelled | failed | "" (no longer current).

    Bounded: when ``settings.MAX_LOST_ATTEMPTS`` started attempts of the job have ended
    without their worker (this one included), the job fails with the count and this cause
    instead. A job that kills whatever runs it, or a worker that keeps dying on it without
    reporting, would otherwise be requeued forever (46 attempts in 6 minutes were seen).
    A placement that never started costs nothing here: that was the node's fault alone.
    """
    # The row as it is now, not as the reaper read it: a placement it saw ``starting`` may have
    # started since (the fenced start), and is then an attempt to charge and to count.
    job = Job.objects.filter(pk=job.pk, attempt_id=job.attempt_id, state__in=HOLDING_STATES).first()
    if job is None:
        return ""
    if job.cancel_requested_at:
        with transaction.atomic():
            if job_transition(job.pk, expected=[job.state], to=JobState.CANCELLED, attempt_id=job.attempt_id):
                usage_charge(job, ended_at=now)
                job_event(job, "cancelled", f"cancelled; {reason}")
                return "cancelled"
        return ""
    if job.state == JobState.RUNNING:
        lost = 1 + JobEvent.objects.filter(job_id=job.pk, kind="node_lost", data__attempt_started=True).count()
        limit = settings.MAX_LOST_ATTEMPTS
        if lost >= limit:
            error = (f"{lost} attempts ended without their worker (MAX_LOST_ATTEMPTS={limit}); "
                     f"not requeued again. The last, attempt {job.attempt}: {reason}")
            with transaction.atomic():
                failed = job_transition(job.pk, expected=HOLDING_STATES, to=JobState.FAILED,
                                        attempt_id=job.attempt_id, error=error)
                if failed:
                    usage_charge(job, ended_at=now)
                    job_event(job, "failed", error)
            if failed:
                kick_scheduler()
                return "failed"
            return ""
    moved = job_requeue(job, reason=f"{reason}; requeued (not counted as a retry)", kind="node_lost",
                        charge_at=now)
    return "requeued" if moved else ""


# --- the worker's side of an attempt -----------------------------------------------------------

# A training process killed by a signal we did not send (OOM killer, an operator, a crash)
# is requeued without spending a retry, at most this many times beyond the retries.
MAX_INFRA_REQUEUES = 10


def attempt_start(*, job_id, attempt_id, node_name: str) -> Job | None:
    """Fenced start: only the current attempt, on the node it was given to, moves starting → running.

    Returns the job (with node, team and user) if this call started it, None if the attempt
    is no longer current or not this node's.
    """
    now = timezone.now()
    # The node by id, not ``node__name``: a filter through a join makes Django's UPDATE a
    # ``WHERE id IN (SELECT …)``, and PostgreSQL re-checks only ``id`` on a row another
    # transaction changed while it waited: two deliveries of one attempt (two slots took the
    # same RQ id 4 ms apart, chaos run seed 3) both "won" the start and both trained.
    node_id = Node.objects.filter(name=node_name).values_list("pk", flat=True).first()
    if node_id is None:
        return None
    # The start and its "running" event in one transaction: a work-horse killed between the two
    # left an attempt that ran (and was charged) with no "running" in its timeline (chaos run).
    with transaction.atomic():
        won = Job.objects.filter(
            pk=job_id, attempt_id=attempt_id, state=JobState.STARTING, node_id=node_id
        ).update(state=JobState.RUNNING, started_at=now, heartbeat_at=now, resume_chosen_at=None,
                 first_started_at=Coalesce(F("first_started_at"), Value(now)))
        if not won:
            return None
        job = Job.objects.select_related("node", "team", "user").get(pk=job_id)
        fault_point("attempt_start")
        job_event(job, "running", f"running on {job.node.name} (GPU {','.join(map(str, job.gpu_indices))}"
                                  f"{', simulated on CPU' if job.node.simulated else ''}), attempt {job.attempt}")
    return job


def attempt_heartbeat(job: Job) -> bool:
    """The attempt's monitor is alive. False once it is no longer the job's current running attempt."""
    return Job.objects.filter(pk=job.pk, attempt_id=job.attempt_id, state=JobState.RUNNING).update(
        heartbeat_at=timezone.now()) == 1


def attempt_check_in(job: Job) -> str:
    """Heartbeat the attempt; return why to stop: "fenced", "cancelled", or "" to go on."""
    if not attempt_heartbeat(job):
        return "fenced"  # requeued, preempted or reaped elsewhere: this attempt is no longer current
    if Job.objects.filter(pk=job.pk, cancel_requested_at__isnull=False).exists():
        return "cancelled"
    return ""


def checkpoint_record(job: Job, *, epoch: int, path: str, sha256: str, size: int, best: bool = False,
                      from_attempt: bool = False) -> Checkpoint | None:
    """Record the verified checkpoint of ``epoch``, keyed by epoch: an attempt that redoes
    epoch N replaces that file with new bytes. Rows whose files the child pruned go too.

    ``from_attempt``: reported by the attempt ``job.attempt_id``; refused (None) once it may no
    longer record (:func:`attempt_may_record`), checked under the job row's lock.

    On a shared filesystem the file already is where the artifact store keeps it, so its key
    is recorded at once; with an object store the node's uploader records it once the bytes
    are there (:func:`checkpoint_stored`), and those rows outlive the node's copy.
    """
    from apps.core.storage import shared_filesystem

    shared = shared_filesystem()
    key = ""
    if shared:
        try:
            key = artifact_key(path)
        except ArtifactKeyError:
            key = ""
    with transaction.atomic():
        if from_attempt and Job.objects.select_for_update().filter(
                attempt_may_record(job), pk=job.pk).values_list("pk", flat=True).first() is None:
            attempt_row_refused(job, f"checkpoint of epoch {epoch}")
            return None
        checkpoint, _ = Checkpoint.objects.update_or_create(
            job=job, epoch=epoch, defaults={"attempt": job.attempt, "path": path, "sha256": sha256, "size": size,
                                            "key": key, "best": best})
        for old in Checkpoint.objects.filter(job=job).exclude(pk=checkpoint.pk):
            if old.key and not shared:
                continue  # in the object store: kept until checkpoint_stored retires it
            if not Path(old.path).exists():
                old.delete()
    return checkpoint


def checkpoint_stored(job: Job, *, epoch: int, sha256: str, key: str, keep: int) -> list[str]:
    """The bytes of ``epoch``'s checkpoint (``sha256``) are in the artifact store under ``key``.

    Recorded only while the row still holds those bytes (a later attempt may have redone the
    epoch). Returns the keys the store no longer needs, for the caller to delete: ``key``
    itself when nothing recorded it, and stored checkpoints beyond the newest ``keep``
    (their rows go) — but the newest ``best`` one, which is the job's best.pt.
    """
    if not Checkpoint.objects.filter(job=job, epoch=epoch, sha256=sha256).update(key=key):
        return [key]
    stored = Checkpoint.objects.filter(job=job).exclude(key="")
    best = stored.filter(best=True).order_by("-epoch").values_list("pk", flat=True).first()
    retired = [c for c in stored.order_by("-epoch")[keep:] if c.pk != best]  # best.pt's bytes stay
    Checkpoint.objects.filter(pk__in=[c.pk for c in retired]).delete()
    return [c.key for c in retired]


def checkpoint_reject(job: Job, checkpoint: Checkpoint, *, message: str) -> None:
    """Drop a checkpoint that is missing, corrupt or unloadable, saying so in the job's events."""
    job_event(job, "checkpoint_rejected", message)
    checkpoint.delete()


def attempt_finish(job: Job, *, outcome: str, exit_code: int | None = None, error: str = "",
                   finished: dict | None = None, cuda_oom_batch: int | None = None) -> str:
    """Record how the worker's attempt ``job.attempt_id`` ended; returns what became of the job.

    ``outcome`` is the executor's word: succeeded, cancelled, timed_out, killed (by a signal
    we did not send), out_of_memory (the kernel's OOM killer acted in the attempt's cgroup),
    failed, or fenced (it learnt the attempt was taken away). ``cuda_oom_batch``: the
    attempt failed with CUDA out of memory while training with this batch size. Returns
    succeeded | cancelled | timed_out | requeued | retry | failed | fenced.

    1. If the attempt is no longer current, only record that its processes stopped (fenced).
    2. succeeded / cancelled / timed_out: the matching final state, usage charged, an event;
       a success records what the job produced (``finished``, the child's final event):
       new weights as a model version, an evaluation, predictions, exports
       (``apps.registry.services.job_outputs_record``).
    3. killed: requeued, not counted as a retry, up to ``MAX_INFRA_REQUEUES`` beyond the retries;
       storage_lost (the node lost the shared storage while it trained: worker.tasks) likewise.
    4. CUDA out of memory: requeued from the last checkpoint with half the batch, at most
       ``CUDA_OOM_RETRIES`` times (:func:`attempt_cuda_oom_retry`), not counted as a retry.
    5. out_of_memory: the final ``failed`` (the same limit would kill a retry again).
    6. failed (and killed past that budget): a retry if one is left (requeue and decrement in
       one conditional update), else the final ``failed`` with ``error`` (terminal colour codes
       stripped and made team-relative by ``paths.public_text`` first).
    """
    current = Job.objects.select_related("team", "user", "node").get(pk=job.pk)
    now = timezone.now()
    if outcome == "fenced" or current.attempt_id != job.attempt_id:
        log.warning("job %s attempt %s was taken away; stopped it", current.pk, job.attempt)
        # Recorded against the old attempt: its process tree is gone, its GPUs truly free.
        job_event(job, "attempt_stopped",
                  f"attempt {job.attempt} stopped: it was requeued, preempted or reaped meanwhile")
        return "fenced"
    mine = {"expected": HOLDING_STATES, "attempt_id": job.attempt_id}
    if outcome == "succeeded":
        finished = finished or {}
        if outside := outputs_outside_run_dir(current, finished):
            log.warning("job %s: its final report names files outside its folder (%s): refused", current.pk,
                        ", ".join(outside))
            error = (f"its results were refused: the training process reported files outside the job's own "
                     f"folder ({', '.join(outside)}); nothing was registered")
            with transaction.atomic():
                if job_transition(current.pk, to=JobState.FAILED, exit_code=exit_code, error=error, **mine):
                    usage_charge(current, ended_at=now)
                    job_event(current, "failed", error)
            return "failed"
        weights = weights_key(finished.get("weights") or "")
        # A sweep's trial keeps what its sweep may register later: the final validation of its
        # best weights, the code versions and the weights' sha256 (apps.sweeps reads them from
        # the event: on another machine, possibly from the artifact store). Hashed here, before
        # the transaction, on the node that has the file.
        kept = None
        if current.parent_id:
            kept = {key: finished.get(key) for key in ("metrics", "code")}
            local = Path(finished.get("weights") or "")
            if weights and local.is_file():
                kept["weights_sha256"] = file_sha256(local)
        # One transaction: whoever sees the job succeeded also sees what it produced.
        with transaction.atomic():
            if not job_transition(current.pk, to=JobState.SUCCEEDED, weights_path=weights, exit_code=0, error="",
                                  **mine):
                return "succeeded"
            try:
                with transaction.atomic():
                    message = job_outputs_record(job=current, finished=finished)
            except Exception as exc:  # noqa: BLE001 - a bug of ours must not leave the job "succeeded" without results
                log.exception("job %s: recording its results failed", current.pk)
                error = f"the job ran, but its results could not be recorded: {type(exc).__name__}: {exc}"
                job_transition(current.pk, expected=[JobState.SUCCEEDED], to=JobState.FAILED, error=error[:2000])
                usage_charge(current, ended_at=now)
                job_event(current, "failed", error[:500])
                return "failed"
            usage_charge(current, ended_at=now)
            job_event(current, "succeeded", message, kept)
            for failure in (e for e in finished.get("exports") or [] if e.get("error")):
                job_event(current, "export_failed",
                          f"{failure.get('format')} export failed: {ansi_strip(str(failure['error']))}",
                          {"format": failure.get("format"), "verification": failure.get("verification") or {}})
        return "succeeded"
    # Each final state below is one transaction with its usage and its event, as a success is:
    # whoever sees the job ended sees it charged (a crash between the writes lost the charge).
    if outcome == "cancelled":
        with transaction.atomic():
            if job_transition(current.pk, to=JobState.CANCELLED, exit_code=exit_code, **mine):
                usage_charge(current, ended_at=now)
                job_event(current, "cancelled", "cancelled; the training process tree was stopped")
        return "cancelled"
    if outcome == "timed_out":
        message = f"exceeded its timeout of {current.timeout_s} s"
        with transaction.atomic():
            if job_transition(current.pk, to=JobState.TIMED_OUT, exit_code=exit_code, error=message, **mine):
                usage_charge(current, ended_at=now)
                job_event(current, "timed_out", message)
        return "timed_out"
    if outcome == "killed" and infra_requeues_left(current):
        usage_charge(current, ended_at=now)
        # A worker stopped on purpose (Ctrl-C, systemctl stop, a deploy) marks its node stopping
        # first and then stops its trainings: "killed by signal 9" read like an out-of-memory kill
        # to the user (trial 16, G7).
        node = current.node
        why = (f"its worker on node {node.name} was stopped (the node is shutting down)"
               if node is not None and node.state == Node.State.STOPPING
               else f"training process was killed by signal {-exit_code}")
        job_requeue(current, kind="requeued",
                    reason=f"{why}; requeued to resume from its last checkpoint (not counted as a retry)")
        return "requeued"
    if outcome == "storage_lost" and infra_requeues_left(current):
        # Its node can no longer read the shared storage and is marked so (worker.tasks): the job
        # resumes from its last checkpoint on a node that can, as a killed training would.
        usage_charge(current, ended_at=now)
        job_requeue(current, kind="storage_unavailable",
                    reason=f"{error}; requeued to resume from its last checkpoint on a node that can read and "
                           f"write the storage (not counted as a retry)")
        return "requeued"
    if outcome == "failed" and cuda_oom_batch and attempt_cuda_oom_retry(current, batch=cuda_oom_batch, now=now):
        return "requeued"
    error = public_text(ansi_strip(error), job=current)  # plain text, team-relative names only
    if current.retries_left > 0 and outcome != "out_of_memory":
        usage_charge(current, ended_at=now)
        if job_requeue(current, kind="retry", retry=True,
                       reason=f"failed ({error.splitlines()[0]}); retrying, "
                              f"{current.retries_left - 1} retries left after this one"):
            return "retry"
    with transaction.atomic():
        if job_transition(current.pk, to=JobState.FAILED, exit_code=exit_code, error=error, **mine):
            usage_charge(current, ended_at=now)
            job_event(current, "failed", error.splitlines()[0] if error else "failed")
    return "failed"


def weights_key(path: str) -> str:
    """The artifact key of the child's weights file (rows hold keys); '' when there is none."""
    try:
        return artifact_key(path) if path else ""
    except ArtifactKeyError:
        log.warning("weights %s are outside the data store; not recorded", path)
        return ""


def attempt_cuda_oom_retry(job: Job, *, batch: int, now: datetime) -> bool:
    """CUDA ran out of memory at ``batch``: requeue (from the newest checkpoint, if any) with half the batch.

    At most ``CUDA_OOM_RETRIES`` times per job and only while the batch can halve. The batch
    as run goes into the job's spec (``spec["as_run"]``, what the worker trains with) in the
    same conditional update that requeues, so the timeline, the spec and the next attempt
    agree. Not counted as a retry. False when no such retry is left.
    """
    as_run = dict(job.spec.get("as_run") or {})
    done = int(as_run.get("cuda_oom_retries", 0))
    if done >= settings.CUDA_OOM_RETRIES or batch < 2:
        return False
    smaller = batch // 2
    as_run.update({"batch": smaller, "cuda_oom_retries": done + 1,
                   "batch_history": [*as_run.get("batch_history", []), batch]})
    newest = job.checkpoints.only("epoch").first()  # what the next attempt resumes from, if any
    whence = f"from its epoch {newest.epoch} checkpoint" if newest else "from the start (no epoch had finished)"
    with transaction.atomic():
        if not Job.objects.filter(pk=job.pk, attempt_id=job.attempt_id, state__in=HOLDING_STATES).update(
                spec={**job.spec, "as_run": as_run}):
            return False
        usage_charge(job, ended_at=now)
        moved = job_requeue(job, kind="cuda_oom", reason=(
            f"CUDA out of memory with batch={batch}: retrying {whence} with batch={smaller} "
            f"({done + 1} of {settings.CUDA_OOM_RETRIES} such retries; not counted as a retry)"))
        if not moved:
            transaction.set_rollback(True)
    return moved


def inside_run_dir(job: Job, path: str) -> bool:
    """``path`` names a file inside the job's own folder (what a training child may report)."""
    if not path:
        return False
    try:
        return Path(path).resolve().is_relative_to(Path(job.run_dir).resolve())
    except (OSError, ValueError):
        return False


def outputs_outside_run_dir(job: Job, finished: dict) -> list[str]:
    """The fields of a child's final report (``finished``) that name a file outside the job's own
    folder, symlinks resolved: ``weights``, ``folder`` (predictions), ``exports[i]``.

    The report is the team's word (a container job runs the team's image; a Slurm relay posts
    it over the API), and the host registers, copies and serves what it names: another team's
    weights or dataset files must not become this job's results (sec21, F1)."""
    named = [("weights", finished.get("weights")), ("folder", finished.get("folder"))]
    named += [(f"exports[{index}]", exported.get("path") if isinstance(exported, dict) else exported)
              for index, exported in enumerate(finished.get("exports") or [])]
    return [field for field, path in named if path and not inside_run_dir(job, str(path))]


def attempt_can_record(job: Job) -> bool:
    """Whether ``job``'s attempt may still record (:func:`attempt_may_record`): one read."""
    return Job.objects.filter(attempt_may_record(job), pk=job.pk).exists()


def attempt_event_record(job: Job, event: dict, *, may_record: bool | None = None) -> None:
    """Record one event of the training child's contract (``worker/train_child.py``) for the
    current attempt: metrics, live progress, checkpoints, the start of training.

    The same for every executor: the local worker reads the events file, the Slurm relay
    posts them to the API. ``finished`` and ``error`` are the caller's (they decide the
    outcome); unknown kinds are ignored. A checkpoint outside the job's folder is refused, and
    so is everything once the attempt may no longer record (:func:`attempt_may_record`): metrics
    and checkpoints in their own writes, live progress and the start of a mode with one read
    (a woken old attempt's "epoch 3, batch 40/120" or "validating…" read as the job's now).
    ``may_record``: the caller's recent answer to that read (:func:`attempt_can_record`), so
    progress, up to 4 events a second, need not cost one read each (review23, 7).
    """
    kind = event.get("type")
    if kind in ("progress", "started") and not (attempt_can_record(job) if may_record is None else may_record):
        attempt_row_refused(job, kind)
        return
    if kind == "epoch":
        metrics_record(job, epoch=int(event["epoch"]), values=event.get("values") or {}, from_attempt=True)
    elif kind == "progress":
        live.publish(job.pk, {"type": "progress", "seq": None, "job": str(job.pk),
                              "data": {k: v for k, v in event.items() if k != "type"}})
    elif kind == "checkpoint":
        if not inside_run_dir(job, str(event.get("path") or "")):
            log.warning("job %s: ignoring a checkpoint outside its folder: %r", job.pk, event.get("path"))
            return
        checkpoint_record(job, epoch=int(event["epoch"]), path=event["path"], sha256=str(event["sha256"]),
                          size=int(event["size"]), best=event.get("best") is True, from_attempt=True)
    elif kind == "started" and event.get("mode", "train") != "train":
        what = {"val": f"validating on the {event.get('split')} split",
                "predict": f"predicting on {event.get('images')} images",
                "export": f"exporting to {', '.join(event.get('formats') or [])}"}.get(event.get("mode"), "started")
        if event.get("note"):  # e.g. half precision asked on a CPU node (worker/model_modes.cpu_half_note)
            what = f"{what}; {event['note']}"
        job_event(job, f"{event.get('mode')}_started", what, {k: v for k, v in event.items() if k != "type"})
    elif kind == "started":
        batch = f" with batch={event['batch']}" if event.get("batch") else ""
        job_event(job, "training_started", f"training epochs {event.get('start_epoch', 1)}..{event.get('epochs')}{batch}",
                  {k: v for k, v in event.items() if k != "save_dir"})  # a server path: not for the team


# --- an attempt far from the database (the Slurm relay) ------------------------------------------

ATTEMPT_TOKEN_SALT = "yoloportal.attempt-token"


def attempt_token_issue(job: Job) -> str:
    """A token that lets the relay of ``job``'s current attempt report it, and nothing else.

    Signed (``SECRET_KEY``), naming the job and the attempt; it expires with the attempt: it
    is refused once the attempt is no longer the job's current starting/running one
    (:func:`attempt_report`), and in any case ``timeout + ATTEMPT_TOKEN_SLACK_S`` after it
    was issued.
    """
    return signing.TimestampSigner(salt=ATTEMPT_TOKEN_SALT).sign_object(
        {"job": str(job.pk), "attempt": str(job.attempt_id)})


class AttemptTokenError(Exception):
    """The token is malformed, forged, expired or for another attempt."""


def attempt_token_check(token: str, *, attempt_id) -> Job:
    """The job whose attempt ``attempt_id`` the token was issued for (raises AttemptTokenError).

    The job may have moved on (requeued, cancelled): :func:`attempt_report` checks that.
    """
    signer = signing.TimestampSigner(salt=ATTEMPT_TOKEN_SALT)
    try:
        claims = signer.unsign_object(token)
    except (signing.BadSignature, ValueError, TypeError):
        raise AttemptTokenError("is not a valid attempt token") from None
    if not isinstance(claims, dict) or claims.get("attempt") != str(attempt_id):
        raise AttemptTokenError("was issued for another attempt")
    job = Job.objects.select_related("node", "team", "user").filter(pk=claims.get("job")).first()
    if job is None:
        raise AttemptTokenError("names a job that does not exist")
    try:
        signer.unsign_object(token, max_age=job.timeout_s + settings.ATTEMPT_TOKEN_SLACK_S)
    except signing.SignatureExpired:
        raise AttemptTokenError("has expired") from None
    return job


def attempt_report(job: Job, *, attempt_id, events: list[dict], log: str, final: dict | None) -> str:
    """What an attempt's relay reports: its events and output, and at the end its final report.

    Recorded while ``attempt_id`` is the job's current attempt, and for an attempt preempted with
    a grace (its epoch end is recorded by design, as a local victim's: :func:`attempt_may_record`
    decides each row). Every report of the current attempt is also its heartbeat. Returns why the
    attempt should stop: "cancelled", "fenced", "preempted" (stop at the current epoch's end: the
    victim's grace is not over; "fenced" after it), or "" to go on.
    """
    from .models import ExecutorAttempt

    current = str(job.attempt_id) == str(attempt_id) and job.state in HOLDING_STATES
    if not current:
        victim = attempt_victim(job, attempt_id=attempt_id)
        if victim is None:
            return "fenced"
        job = victim
    for event in events:
        kind = event.get("type")
        if kind in ("finished", "error"):
            continue  # part of the final report: the agent decides the outcome with Slurm's word
        if kind == "checkpoint_rejected":  # the relay fell back to an older checkpoint (exit 4)
            for checkpoint in Checkpoint.objects.filter(job=job, epoch=int(event.get("epoch") or 0)):
                checkpoint_reject(job, checkpoint, message=f"Ultralytics could not load the checkpoint of epoch "
                                                           f"{checkpoint.epoch}; trying an older one")
        elif kind == "time_limit":
            job_event(job, "time_limit", str(event.get("message") or "the time limit is near")[:500])
        elif kind == "stopping" and not current:  # the relay touched the stop file on our "preempted"
            attempt_event_once(job, "stopping", f"preempted: stopping at the end of the current epoch "
                                                f"(at most {attempt_stop_grace(job):.0f} s)")
        elif kind == "stopped":  # after the checkpoint, as asked (preempted, or Slurm's time limit near)
            epoch = int(event.get("epoch") or 0)
            attempt_event_once(job, "stopped_at_epoch_end", f"stopped after epoch {epoch} as asked", {"epoch": epoch})
        else:
            # The current attempt was fenced above, from the row this report read: it records while
            # running. A preempted victim's progress asks the fence itself (its next attempt may have
            # chosen its checkpoint since: attempt_may_record).
            attempt_event_record(job, event, may_record=job.state == JobState.RUNNING if current else None)
    if log:
        log_append(job, log, from_attempt=True)
    if final is not None:
        ExecutorAttempt.objects.filter(attempt_id=attempt_id).update(report=final)
    stop = attempt_check_in(job) if current else "fenced"
    if stop != "fenced":
        return stop
    # Not current, or preempted between the job's read above and the check-in: a graceful victim
    # hears "preempted" either way (a lone "fenced" made its relay kill the training mid-epoch).
    victim = job if not current else attempt_victim(job, attempt_id=attempt_id)
    if victim is None:
        return "fenced"
    if Job.objects.filter(pk=job.pk, cancel_requested_at__isnull=False).exists():
        return "cancelled"
    stop_by = attempt_stop_by(victim)
    return "preempted" if stop_by is not None and timezone.now() < stop_by else "fenced"


def attempt_event_once(job: Job, kind: str, message: str, data: dict | None = None) -> None:
    """``job_event`` for the attempt ``job.attempt``, unless it has one of ``kind`` already: a stop
    happens once, and the report is the compute node's word (its job's process can post one)."""
    if not JobEvent.objects.filter(job_id=job.pk, attempt=job.attempt, kind=kind).exists():
        job_event(job, kind, message, data)


def attempt_victim(job: Job, *, attempt_id) -> Job | None:
    """``job`` as it was during its earlier attempt ``attempt_id`` (its number and id) if that attempt
    was preempted with a grace after it had started, else None (a relay told "fenced")."""
    event = attempt_preemption(job, attempt_id=attempt_id)
    data = (event.data or {}) if event else {}
    if not data.get("attempt_started") or preemption_grace_s(event) <= 0:
        return None
    victim = Job.objects.select_related("node", "team", "user").get(pk=job.pk)
    victim.attempt, victim.attempt_id = int(data["ended_attempt"]), uuid.UUID(str(attempt_id))
    return victim


# --- submit -----------------------------------------------------------------------------------


@dataclass
class ResolvedSpec:
    spec: JobSpec
    team: Team
    resolved: dict  # what the worker needs (artifact keys): apps.jobs.inputs
    inputs: dict  # what the job used (dataset and weights versions with their hashes)


def spec_team(spec: JobSpec, user) -> tuple[Team | None, dict[str, str]]:
    """The team the job is charged to (the spec's ``team``, else the user's only one), or the error."""
    teams = team_rows(user=user)
    if spec.charge_to:
        team = next((t for t in teams if t.slug == spec.charge_to), None)
        if team is not None:  # a team's name first: a user named like one of their teams names it (review29)
            return team, {}
        if spec.charge_to != user.username:
            return None, {spec.charge_field: f"you are not a member of a team named {spec.charge_to!r}"}
    if len(teams) == 1:
        return teams[0], {}
    if teams:  # which one was a guess: the first by name took the job, its quota and its data= (trial26)
        return None, {spec.charge_field: f"is required: you are in several teams "
                                         f"({', '.join(t.slug for t in teams)}); say which one the job is for "
                                         f"(team: {teams[0].slug})"}
    return None, {"user": "you belong to no team; ask a manager to add you to one"}


def spec_parse(document: Any, *, user) -> JobSpec:
    """:func:`parse_spec` for a user's submit: when it refuses the document, the dataset and model
    the spec names are checked too wherever they could be read, so every independent problem
    comes in one answer — a bad ``epochs`` hid an unknown dataset until it was fixed (trial 16,
    G9). Raises SpecError; a spec it returns still goes through :func:`spec_resolve`."""
    try:
        return parse_spec(document)
    except SpecError as exc:
        spec = exc.partial
        # Only a command (or structured mode) that parsed has arguments worth resolving.
        if spec is not None and not {"command", "train", "val", "predict", "export"} & exc.errors.keys():
            team, team_errors = spec_team(spec, user)
            found = inputs_resolve(spec=spec, team=team)[2] if team is not None else team_errors
            if spec.sweep and team is not None:  # its model choices, its bounds against the limits (G6)
                found.update(sweep_errors(spec, team))
            for path, message in found.items():
                exc.errors.setdefault(path, message)
        raise


def spec_resolve(*, spec: JobSpec, user, trial: bool = False) -> ResolvedSpec:
    """Check what needs the database; raise SpecError naming the field."""
    team, errors = spec_team(spec, user)

    resolved: dict = {}
    inputs: dict = {}
    registers = spec.mode == "train" and team is not None and not trial  # a trial: its sweep registers
    # The dataset and the registry name are read in one statement on PostgreSQL (reads_ahead).
    ahead = inputs_reads_ahead(spec=spec, team=team) if team is not None else []
    if registers and spec.task:
        ahead += model_name_task_ahead(team=team, name=model_name_of(spec.task_name))
    with reads_ahead(ahead):
        if team is not None:
            resolved, inputs, input_errors = inputs_resolve(spec=spec, team=team)
            errors.update(input_errors)
        if spec.mode == "train":
            errors.update(train_args_limit_errors(spec))
            if registers:
                errors.update(registry_task_errors(spec, team, resolved))
        elif spec.mode == "val" and (problem := workers_limit_error(spec)):
            errors[f"{'command' if spec.command else 'val'}.workers"] = problem
    if spec.sweep and team is not None:
        errors.update(sweep_errors(spec, team))
    if spec.sweep:
        # The task the trials train: the model's own (weights, a registered version, a YAML's head),
        # else the one the spec names; weights of unknown task leave it open.
        task = resolved.get("task") or (spec.task if spec.task_named else "")
        if not spec.sweep_metric_given:
            spec.sweep["metric"] = sweep_default_metric(task)
        problem = sweep_metric_problem(spec.sweep["metric"], task)
        if problem:
            errors["sweep.metric"] = problem
    if spec.priority == "urgent" and team is not None and not trial:
        # A trial takes its sweep's class: checked at the sweep's submit, or a manager's (F23).
        errors.update(urgent_errors(team, user))

    timeout = spec.timeout_s or settings.DEFAULT_JOB_TIMEOUT_S
    if timeout > settings.MAX_JOB_TIMEOUT_S:
        errors["timeout"] = f"is {timeout} s; the limit is {settings.MAX_JOB_TIMEOUT_S} s"
    elif spec.mode == "train" and timeout < settings.MIN_TRAIN_TIMEOUT_S:
        minimum = settings.MIN_TRAIN_TIMEOUT_S
        errors["timeout"] = (f"is {timeout} s; a training's timeout is at least {minimum} s "
                             f"({minimum / 60:g} min, MIN_TRAIN_TIMEOUT_S): its process starts and loads the model "
                             "first, so a shorter one ends it before it trains")

    request = JobRequest(job_id="?", team=team.slug if team else "", user="", submitted_at=0, gpus=spec.gpus,
                         gpu_memory_mb=spec.gpu_memory_mb, gpu_models=tuple(spec.gpu_models),
                         cpu_milli=spec.cpu_milli, memory_mb=spec.memory_mb, image=spec.image,
                         requires=tuple(spec.requires))
    errors.update(job_admission_errors(request, team_known=team is not None))
    if errors:
        raise SpecError(errors)
    return ResolvedSpec(spec=spec, team=team, resolved=resolved, inputs=inputs)


def registry_task_errors(spec: JobSpec, team: Team, resolved: dict) -> dict[str, str]:
    """A training whose weights would become a version of a registered name of another task.

    A training registers its weights as the next version of its task name (a sweep: its best
    trial's, under the sweep's); ``model=NAME:latest`` would then silently become a model of
    another task (trial23: detect v1, classify v2). The task is known now, as the registry will
    record it (the model's own, else the spec's: ``_trained_task``), so the submit is refused early
    rather than the training registered elsewhere after its GPU time. This is a courtesy, not the
    guarantee: it reads only the registry (one prepared query; the submit path is measured), so a
    detect and a classify training queued under a name with no version yet both pass. The
    registration keeps a name's versions one task (apps.registry.services.version_number_claim):
    the later of the two is registered as ``NAME-TASK``, and its outcome says so.
    """
    task = resolved.get("task") or spec.task
    if not task:
        return {}
    name = model_name_of(spec.task_name)
    registered, versions = model_name_task(team=team, name=name)
    if not registered or registered == task:
        return {}
    shown = ", ".join(versions[:3]) + (" …" if len(versions) > 3 else "")
    return {"task_name": (
        f"registers its weights as model {name!r} of team {team.slug}, whose versions are {registered} models "
        f"({shown}), but this job trains {task}: a name's versions are one task, so that {name}:latest never "
        f"switches task. Give another task_name (e.g. {name}-{task})")}


def urgent_errors(team: Team, user) -> dict[str, str]:
    """An urgent submit where the team lets only its managers submit urgent jobs (Team.urgent_by)."""
    if team.urgent_by != Team.UrgentBy.MANAGERS or user.is_superuser:
        return {}
    managers = Membership.objects.filter(team=team, role__in=MANAGING_ROLES, user__is_active=True)
    if managers.filter(user=user).exists():
        return {}
    names = ", ".join(sorted(managers.values_list("user__username", flat=True))) or "none at present"
    return {"priority": f"team {team.slug} lets only its managers submit urgent jobs (its managers: {names}): "
                        "submit it as high, or ask a manager to raise its class once it is queued"}


def workers_limit_error(spec: JobSpec) -> str | None:
    """Why the spec's ``workers`` (dataloader processes, each with its own copy of the pipeline) is
    refused, or None: the one limit is ``TRAIN_MAX_WORKERS`` (the parser checks only that it is a
    count), and at most the CPUs the job asked for (``resources.cpu``). Training and val jobs alike."""
    workers = spec.train_args.get("workers")
    if not isinstance(workers, int):
        return None
    cpus = spec.cpu_milli // 1000 if spec.cpu_milli else None
    if workers > settings.TRAIN_MAX_WORKERS:
        return f"is {workers}; the limit is {settings.TRAIN_MAX_WORKERS} dataloader workers per job (TRAIN_MAX_WORKERS)"
    if cpus is not None and workers > max(cpus, 1):
        return (f"is {workers}, but the job asks for {spec.cpu_milli / 1000:g} CPU(s) (resources.cpu): "
                f"use at most {max(cpus, 1)} workers, or ask for more CPUs")
    return None


def train_args_limit_errors(spec: JobSpec) -> dict[str, str]:
    """Training arguments that would take what a node shares with other jobs (issue 9, finding 6).

    Each is refused (not capped), so what runs is exactly what the spec says:

    - ``save_period``: Ultralytics writes a full weights file every ``save_period`` epochs
      and keeps them all; more than ``TRAIN_MAX_SAVED_EPOCHS`` files fill the node's disk
      (the platform keeps its own resume checkpoints anyway).
    - ``workers``: dataloader processes, each with its own copy of the pipeline: at most
      ``TRAIN_MAX_WORKERS``, and at most the CPUs the job asked for (``resources.cpu``).
    - ``cache=ram`` (and ``true``, which means ram): the whole dataset in the node's RAM.
    - ``cache=disk``: Ultralytics writes an ``.npy`` beside every image (``im_file.with_suffix('.npy')``),
      ~24× the images' size, into the dataset's own folder: the team's registered dataset on the
      shared DATA_DIR (a node's shared cache entry with an object store), which every job of the
      team reads at once and no storage quota counts. So ``cache`` is ``false`` or left out.

    ``batch=-1`` or a fraction on a share of a GPU is allowed: the training child caps its
    GPU memory to the share and auto-batch sizes against it (``worker/train_child.py:
    apply_limits``; issue 12).
    """
    prefix = "command" if spec.command else "train"
    args = spec.train_args
    errors: dict[str, str] = {}
    epochs = int(args.get("epochs") or 0)
    period = args.get("save_period")
    limit = settings.TRAIN_MAX_SAVED_EPOCHS
    if isinstance(period, int) and period > 0 and epochs // period > limit:
        errors[f"{prefix}.save_period"] = (
            f"save_period={period} with epochs={epochs} keeps {epochs // period} weight files; the limit is {limit} "
            f"(use save_period >= {-(-epochs // limit)}, or -1: the platform keeps its own resume checkpoints)")
    if problem := workers_limit_error(spec):
        errors[f"{prefix}.workers"] = problem
    if args.get("cache") in (True, "ram"):
        errors[f"{prefix}.cache"] = (
            "cache=ram (or true) loads the whole dataset into the node's RAM, which other jobs share; "
            "leave cache out (or cache=false): images are read from the dataset as training goes")
    elif args.get("cache") == "disk":
        errors[f"{prefix}.cache"] = (
            "cache=disk writes a .npy copy of every image, about 24 times the images' size, into the dataset's "
            "own folder, which your team's other jobs read at the same time and no storage quota counts; "
            "cache=ram is refused too (the node's RAM is shared): leave cache out (or cache=false)")
    return errors


def sweep_errors(spec: JobSpec, team) -> dict[str, str]:
    """What only the database and settings can say about a sweep (apps.jobs.spec_sweep checked its shape).

    Each value a parameter may take is checked as a trial would be: ``model`` choices as a plain
    submit of that model is (:func:`~apps.jobs.inputs.inputs_resolve`), and the bounds and choices must pass the per-job limits (``batch`` on a GPU
    share, ``workers``, …). ``parallel`` must leave room under MAX_ACTIVE_JOBS_PER_USER
    (the parent counts as one active job).
    """
    errors: dict[str, str] = {}
    cap = settings.MAX_ACTIVE_JOBS_PER_USER
    if spec.sweep["parallel"] >= cap:
        errors["sweep.parallel"] = (f"is {spec.sweep['parallel']}; you may have at most {cap} active jobs "
                                    f"(MAX_ACTIVE_JOBS_PER_USER), the sweep itself counting as one")
    prefix = "command" if spec.command else "train"
    base: dict[str, str] | None = None  # the spec's own input errors, reported on their own fields
    for name, parameter in spec.sweep["parameters"].items():
        where = f"sweep.parameters.{name}"
        candidates = (list(enumerate(parameter["choices"])) if parameter["type"] == "categorical"
                      else [("low", parameter["low"]), ("high", parameter["high"])])
        for label, value in candidates:
            path = f"{where}[{label}]" if isinstance(label, int) else f"{where}.{label}"
            if name == "model":
                # The checks a plain submit of that trial makes (inputs_resolve: the model resolves, is
                # the task the spec names, and the dataset's labels serve its task): the trial would
                # otherwise be "not submitted" once drawn (new-user trial 16, G5).
                base = base if base is not None else inputs_resolve(spec=spec, team=team)[2]
                trial = replace(spec, train_args={**spec.train_args, "model": value})
                found = {k: v for k, v in inputs_resolve(spec=trial, team=team)[2].items() if base.get(k) != v}
                if found:
                    errors[path] = "; ".join(v if k.endswith(".model") else f"{k}: {v}" for k, v in found.items())
                continue
            trial = replace(spec, train_args={**spec.train_args, name: value})
            problem = train_args_limit_errors(trial).get(f"{prefix}.{name}")
            if name == "freeze" and not problem:
                problem = freeze_problem(freeze=value, model=spec.train_args.get("model", ""))
            if problem:
                errors[path] = problem
    return errors


# Submit's own reads, compiled once per connection (apps/core/prepared.py).
# ``exclude(idempotency_key="")`` is implied by a key, and says so to the database: the unique
# index on (user, key) is partial (keys not ''), and without it SQLite cannot use that index
# and walks every job the user ever had.
KEY_USED = PreparedRead(
    lambda user_id, key: Job.objects.filter(user_id=user_id, idempotency_key=key).exclude(idempotency_key="")
    .values_list("pk", flat=True)[:1],
    samples=({"user_id": 1, "key": "a"}, {"user_id": 2, "key": "b"}))

JOB_INSERT = PreparedInsert(Job)
EVENT_INSERT = PreparedInsert(JobEvent)
# The user's row lock that serialises one user's submits for the active-job cap (PostgreSQL).
USER_LOCK = PreparedRead(
    lambda user_id: get_user_model().objects.select_for_update(no_key=True).filter(pk=user_id)
    .values_list("pk", flat=True), samples=({"user_id": 1}, {"user_id": 2}))


def active_jobs_count(user_id: int, *, limit: int) -> int:
    """How many active jobs the user has, counted up to ``limit`` (MAX_ACTIVE_JOBS_PER_USER).

    Submit only asks whether the cap is reached, so at most ``limit`` index entries are read
    however many jobs the user has queued (an exact count when it is below ``limit``).
    ``COUNT(*)``, not ``COUNT(id)``: the (user, state) index answers it alone; counting the
    uuid primary key made SQLite read every active job's table row (~1 ms at 1,500 queued).
    """
    states = [state.value for state in ACTIVE_STATES]
    if binds_on_server(connection):
        # Prepared on PostgreSQL like the submit's other statements (apps/core/prepared.py). Bound
        # on the server, a plain int is typed by its size (int2/int4/int8), and each type is
        # another prepared statement (user ids below and above 32,768: review27).
        from psycopg.types.numeric import Int8

        user_id, limit = Int8(user_id), Int8(limit)
    with statement_cursor(connection) as cursor:
        cursor.execute(_ACTIVE_COUNT_SQL.format(states=", ".join(["%s"] * len(states))), [user_id, *states, limit])
        return cursor.fetchone()[0]


_ACTIVE_COUNT_SQL = (f'SELECT COUNT(*) FROM (SELECT 1 FROM "{Job._meta.db_table}" '
                     'WHERE "user_id" = %s AND "state" IN ({states}) LIMIT %s) AS active')


def job_submit(*, user, spec: JobSpec, raw_spec: str = "", idempotency_key: str = "",
               parent: Job | None = None, job_id: uuid.UUID | None = None,
               continued_from: dict | None = None) -> tuple[Job, bool]:
    """Validate against the database and queue the job. Returns (job, created).

    1. An ``idempotency_key`` already used by this user returns that job (created=False)
       when this is the same request (:func:`job_is_same_request`), and refuses it
       (IdempotencyKeyReused) when it is another: the caller must not take the old job
       for the one it asked for now.
    2. Resolve team, dataset, model and capacity (SpecError on any problem).
    3. Refuse an identical active job of the same team (DuplicateJob) unless allowed.
    4. Insert the job, its first event and the audit entry; then refuse (rolling all of it
       back) when the user now has more than MAX_ACTIVE_JOBS_PER_USER active jobs
       (TooManyActiveJobs), counted in the inserting transaction with the user's row locked
       (PostgreSQL; SQLite's IMMEDIATE transactions serialise writers anyway), so parallel
       submits cannot pass it. The rows are made before the transaction, which only sends
       them with the lock (one statement on PostgreSQL), so one user's submits wait for each
       other only for the count and the commit.
    5. Kick the scheduler after commit (from this process's kicker thread: apps.scheduling.kick).

    A sweep (``spec.sweep``) is inserted as its parent: running at once, on no node, with no
    GPU (``gpus`` 0), so the scheduler never places it; the scheduler's sweep step
    (apps.sweeps) then submits its trials here with ``parent`` set, as ordinary train jobs.

    A continuation (apps.jobs.continuation) gives the ``job_id`` its checkpoint was copied
    under and its lineage, ``continued_from``, kept in the stored spec.
    """
    left_behind = None  # the job the key made in a team the user has left since
    # The replay check and the user's teams (spec_resolve's first read) are one statement on
    # PostgreSQL (reads_ahead).
    key_used = [(KEY_USED, {"user_id": user.pk, "key": idempotency_key})] if idempotency_key else []
    with reads_ahead(key_used + team_rows_ahead(user=user)):
        # Almost always a new key: ask whether it is known (KEY_USED) and read the whole row
        # only for a replay.
        if idempotency_key and KEY_USED(user_id=user.pk, key=idempotency_key) and (
                existing := Job.objects.filter(user=user, idempotency_key=idempotency_key).first()):
            if not job_visible_to(existing, user):
                # Answered as any submit would be (a spec naming that team: "not a member"), never
                # with the job: every read of it is a 404 for them now (sec19, F2).
                left_behind = existing
            elif not job_is_same_request(existing, spec, continued_from):
                raise IdempotencyKeyReused(existing)
            else:
                return existing, False
        resolved = spec_resolve(spec=spec, user=user, trial=parent is not None)
    if left_behind is not None:
        raise IdempotencyKeyReused(left_behind, visible=False)
    fingerprint = spec.fingerprint()
    if not spec.allow_duplicate:
        # A job whose cancel is requested is ending (its worker stops it): no twin. Cancel and resubmit
        # was a 409 naming the job just cancelled, "running" while it stopped (trial 31).
        twin = Job.objects.filter(team=resolved.team, spec_hash=fingerprint, state__in=ACTIVE_STATES,
                                  cancel_requested_at__isnull=True).first()
        if twin:
            # A retry that raced the first request under its key asked KEY_USED before that one
            # committed: the key's job is the answer (as in the IntegrityError branch below), not a
            # 409 naming it (trial26). Only read where a twin exists, so the usual submit pays nothing.
            if (mine := _key_replay(user, idempotency_key, spec, continued_from)) is not None:
                return mine, False
            raise DuplicateJob(twin)
    stored = spec.as_dict()
    stored["resolved"] = resolved.resolved
    stored["inputs"] = resolved.inputs
    if continued_from:
        stored["continued_from"] = continued_from
    now = timezone.now()
    kind: dict[str, Any] = {"queued_at": now, "reason": "waiting for the scheduler",
                            "runtime_signature": spec.runtime_signature(), "gpus": spec.gpus}
    if spec.sweep:
        if stored["sweep"]["seed"] is None:  # drawn once, so every later proposal can be replayed
            stored["sweep"]["seed"] = secrets.randbelow(2**31)
        kind = {"is_sweep": True, "state": JobState.RUNNING, "gpus": 0.0, "queued_at": None, "reason": "",
                "runtime_signature": "", "started_at": now, "first_started_at": now}
    # The three rows are made and their values converted before the transaction, which then
    # only sends them (SQLite's write lock, held from BEGIN IMMEDIATE to COMMIT, is the one
    # thing every submit of every web process waits for). The job's uuid is known already.
    job_row = JOB_INSERT.prepare(
        seq=1,  # the "submitted" event's
        task_name=spec.task_name,
        team=resolved.team,
        user=user,
        priority_class=spec.priority,
        raw_spec=raw_spec,
        spec=stored,
        spec_hash=fingerprint,
        idempotency_key=idempotency_key,
        gpu_memory_mb=spec.gpu_memory_mb,
        cpu_milli=spec.cpu_milli,
        memory_mb=spec.memory_mb,
        timeout_s=spec.timeout_s or settings.DEFAULT_JOB_TIMEOUT_S,
        retries_left=spec.retries,
        parent=parent,
        **({"id": job_id} if job_id else {}),
        **kind,
    )
    job = job_row.obj
    # The job's first event, written directly: nobody can be watching a job that did
    # not exist a moment ago (a page that opens later reads it from the database),
    # so no sequence round trip and no publish. "submitted" notifies nobody.
    what = (f"sweep of {spec.sweep['trials']} trials ({spec.sweep['method']}, {spec.sweep['parallel']} at once)"
            if spec.sweep else f"trial of sweep {parent.task_name}" if parent else
            f"continues job {continued_from['job']} from its checkpoint of epoch {continued_from['epoch']}"
            if continued_from else "")
    event_row = EVENT_INSERT.prepare(job=job, seq=1, attempt=1, kind="submitted",
                                     message=f"submitted by {user.username} for team {resolved.team.slug}"
                                             f"{'; ' + what if what else ''}")
    audit_row = audit_prepare(actor=user, action=AuditEntry.Action.JOB_SUBMIT, team=job.team_id, target=job,
                              message=job.task_name, data={"priority": spec.priority})
    try:
        with transaction.atomic():
            # SQLite has no row locks (the ORM would send a plain SELECT): its IMMEDIATE
            # transaction already holds the database's one write lock. NO KEY UPDATE: the rows
            # inserted hold KEY SHARE locks on the user's row (their foreign keys), which FOR
            # UPDATE would wait on — two submits would deadlock. On PostgreSQL the three rows and
            # the lock are one statement (rows_insert); the count below is the next one, so its
            # snapshot is taken once the lock is held and sees the previous holder's job.
            lock = USER_LOCK if connection.features.has_select_for_update else None
            rows_insert((job_row, event_row, audit_row), lock=lock, lock_values={"user_id": user.pk})
            # The count includes the job just inserted (active: queued, or a running sweep).
            limit = settings.MAX_ACTIVE_JOBS_PER_USER
            if active_jobs_count(user.pk, limit=limit + 1) > limit:
                # The refusal says the exact count before this job (a cap lowered below what a
                # user has); raising rolls the job, its event and its audit entry back.
                raise TooManyActiveJobs(
                    Job.objects.filter(user=user, state__in=ACTIVE_STATES).exclude(pk=job.pk).count(), limit)
            # From the process's kicker thread, coalesced: no Redis round trip on the request's path.
            transaction.on_commit(kick_scheduler_soon)
    except IntegrityError:
        # Two requests with the same Idempotency-Key raced; the other one won.
        existing = _key_replay(user, idempotency_key, spec, continued_from)
        if existing is None:
            raise
        return existing, False
    return job, True


def _key_replay(user, idempotency_key: str, spec: JobSpec, continued_from: dict | None) -> Job | None:
    """The job an earlier request under ``idempotency_key`` made, this request being its replay;
    None when the key made none. IdempotencyKeyReused when that job is another request's, or one
    the user can no longer see (the answer then names no job of it: sec19, F2)."""
    existing = Job.objects.filter(user=user, idempotency_key=idempotency_key).first() if idempotency_key else None
    if existing is None:
        return None
    if not job_visible_to(existing, user):
        raise IdempotencyKeyReused(existing, visible=False) from None
    if not job_is_same_request(existing, spec, continued_from):
        raise IdempotencyKeyReused(existing) from None
    return existing


def job_cancel(*, job: Job, by, reason: str = "") -> bool:
    """Cancel: a queued job at once; a starting/running one is stopped by its worker.

    A running job whose worker is gone is cancelled by the scheduler's reaper instead of
    being requeued, so a cancel always ends in ``cancelled``. ``by`` is the user who asked, an
    operator's label (``operator_named``: audited as that operator), or None for the platform (a sweep pruning a trial); ``reason`` then says why, in the
    job's events. A sweep parent is cancelled at once, with its queued and running trials.
    """
    if job.is_sweep:
        return sweep_cancel(job, by=by, reason=reason)
    now = timezone.now()
    who = f" by {actor_name(by)}" if by is not None else ""
    why = f": {reason}" if reason else ""
    data = cancellation_data(job, by=by, reason=reason)
    if job_transition(job.pk, expected=[JobState.QUEUED], to=JobState.CANCELLED, cancel_requested_at=now):
        job_event(job, "cancelled", f"cancelled{who} while queued{why}", data)
        if by is not None:
            audit_record(actor=by, action=AuditEntry.Action.JOB_CANCEL, team=job.team_id, target=job,
                         message="while queued")
        kick_scheduler()
        return True
    requested = Job.objects.filter(
        pk=job.pk, state__in=HOLDING_STATES, cancel_requested_at__isnull=True
    ).update(cancel_requested_at=now)
    if requested:
        job_event(job, "cancel_requested", f"cancel requested{who}{why}", data)
        if by is not None:
            audit_record(actor=by, action=AuditEntry.Action.JOB_CANCEL, team=job.team_id, target=job,
                         message="while running")
        return True
    return False


def cancellation_data(job: Job, *, by, reason: str) -> dict:
    """Who cancelled and why, kept in the cancel's event: the owner is told when someone else
    (a manager, an operator, a departure, the platform) cancelled their job (trial 16, G8)."""
    by_owner = by is not None and not isinstance(by, str) and by.pk == job.user_id
    return {"cancelled_by": actor_name(by) if by is not None else "the platform", "by_owner": by_owner,
            "reason": reason}


def sweep_cancel(parent: Job, *, by, reason: str = "") -> bool:
    """Cancel a sweep: the parent at once, then each of its queued and running trials.

    A trial the sweep step submits while this runs is caught by that step: it cancels the
    active trials of a sweep that has ended (apps.sweeps.services.sweeps_advance).
    """
    now = timezone.now()
    if not job_transition(parent.pk, expected=ACTIVE_STATES, to=JobState.CANCELLED, cancel_requested_at=now):
        return False
    who = f"by {actor_name(by)}" if by is not None else "by the platform"
    trials = list(Job.objects.filter(parent=parent, state__in=ACTIVE_STATES).select_related("team"))
    why = f": {reason}" if reason else ""
    job_event(parent, "cancelled", f"cancelled {who}{why}; cancelling its {len(trials)} queued or running trial(s)",
              cancellation_data(parent, by=by, reason=reason))
    if by is not None:
        audit_record(actor=by, action=AuditEntry.Action.JOB_CANCEL, team=parent.team_id, target=parent,
                     message="sweep with its trials")
    for trial in trials:
        job_cancel(job=trial, by=None, reason=f"its sweep {parent.task_name} was cancelled")
    kick_scheduler()
    return True


def sweep_finish(parent: Job, *, state: str, message: str, error: str = "", best: Job | None = None,
                 register=None, data: dict | None = None) -> bool:
    """End a running sweep parent (the sweep step decides; this writes). True if this call ended it.

    ``best`` is the trial whose weights the sweep keeps (``weights_path``); ``register``,
    if given, is called with no argument inside the same transaction as the final state,
    so whoever sees the sweep succeeded also sees its registered model version.
    """
    with transaction.atomic():
        if not job_transition(parent.pk, expected=[JobState.RUNNING], to=state, error=error[:2000],
                              weights_path=best.weights_path if best is not None else "",
                              exit_code=0 if state == JobState.SUCCEEDED else None):
            return False
        if register is not None:
            message = f"{message}; {register()}"
        job_event(parent, state, message, data or {})
    return True


# --- telemetry written by the worker ---------------------------------------------------------


def metrics_record(job: Job, *, epoch: int, values: dict[str, Any], from_attempt: bool = False) -> MetricPoint | None:
    """Upsert one epoch's metrics (a redone epoch replaces its point) and publish it.

    ``from_attempt``: reported by the attempt ``job.attempt_id``; refused (None) once it may no
    longer record (:func:`attempt_may_record`), in the seq update the point needs anyway: no
    extra query on the hot path.
    """
    with transaction.atomic():
        seq = seq_allocate(job.pk, where=attempt_may_record(job) if from_attempt else None)
        if seq is None:
            attempt_row_refused(job, f"metrics of epoch {epoch}")
            return None
        point, _ = MetricPoint.objects.update_or_create(
            job_id=job.pk, epoch=epoch, defaults={"attempt": job.attempt, "seq": seq, "values": values}
        )
        Job.objects.filter(pk=job.pk, epochs_done__lt=epoch).update(epochs_done=epoch)
        live.publish_on_commit(job.pk, {"type": "metrics", "seq": seq, "job": str(job.pk),
                                        "data": {"epoch": epoch, "attempt": job.attempt, "values": values}})
    if job.parent_id:
        kick_scheduler()  # a sweep's pruner judges each epoch of its trials (apps.sweeps)
    return point


def log_append(job: Job, text: str, *, from_attempt: bool = False) -> LogChunk | None:
    """Store and publish a piece of the job's output, up to JOB_LOG_MAX_BYTES per job.

    The piece that crosses the cap is cut there and followed by one notice; later pieces
    are dropped (None). The count is a conditional update, so the notice is written once.
    ``from_attempt``: the output of the attempt ``job.attempt_id``, dropped (None) once it may
    no longer record (:func:`attempt_may_record`), in that same update.
    """
    if not text:
        return None
    text = public_text(text, job=job)
    limit = settings.JOB_LOG_MAX_BYTES
    size = len(text.encode())
    fence = attempt_may_record(job) if from_attempt else Q()
    with transaction.atomic():
        if not Job.objects.filter(fence, pk=job.pk, log_bytes__lt=limit).update(log_bytes=F("log_bytes") + size):
            if from_attempt and not Job.objects.filter(fence, pk=job.pk).exists():  # only when refused
                attempt_row_refused(job, f"output ({size} bytes)")
            return None
        total = Job.objects.filter(pk=job.pk).values_list("log_bytes", flat=True).get()
        if total > limit:
            keep = size - (total - limit)
            text = (text.encode()[:keep].decode("utf-8", "ignore")
                    + f"\n[log truncated: this job's log reached {limit} bytes (JOB_LOG_MAX_BYTES); "
                      "later output is not stored]\n")
        seq = seq_allocate(job.pk)
        chunk = LogChunk.objects.create(job_id=job.pk, seq=seq, attempt=job.attempt, text=text)
        live.publish_on_commit(job.pk, {"type": "log", "seq": seq, "job": str(job.pk), "data": {"text": text}})
    return chunk


def log_full(job: Job) -> bool:
    """Whether the job's stored log has reached JOB_LOG_MAX_BYTES."""
    return Job.objects.filter(pk=job.pk, log_bytes__gte=settings.JOB_LOG_MAX_BYTES).exists()
