"""The live scheduler: each step is a function that returns "did work?" and is testable alone.

``manage.py scheduler`` runs :func:`tick` whenever it is kicked (submit, finish, cancel,
node change) and at least every ``SCHEDULER_TICK_S`` seconds.
"""

from __future__ import annotations

import logging
import math
import re
from datetime import UTC, datetime, timedelta

import redis
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.cluster.models import Node
from apps.cluster.services import node_mark_lost
from apps.core.faults import fault_point
from apps.core.redis_outage import connection_error_of, redis_unreachable
from apps.jobs.models import HOLDING_STATES, Job, JobState
from apps.jobs.services import (
    attempt_lost,
    attempt_preempt,
    job_claim,
    job_dispatched,
    job_event,
    job_queue_info_set,
)
from apps.sweeps.services import sweeps_advance

from . import policy
from .dispatch import dispatch, undelivered
from .inputs import QueueRows, cluster_state
from .leader import fenced

log = logging.getLogger(__name__)


def reap_lost_nodes(now: datetime | None = None) -> bool:
    """Mark nodes silent past the grace period as lost, and requeue what any lost node holds.

    A node is also lost, at once, when its worker stops cleanly (``gpu_worker`` marks it so on
    its way out, apps.cluster.services.node_stopped, and kicks the scheduler): what it held is
    requeued here in the next pass, not after the grace period. So is a job claimed on a
    node that was marked lost while the claim's pass was planning. Nothing is placed on a
    lost node, so each attempt it held is requeued once (one fault, one attempt).

    A job whose cancel was requested is cancelled instead, so a cancel always ends.
    """
    now = now or timezone.now()
    grace = timedelta(seconds=settings.NODE_GRACE_S)
    did = False
    for node in Node.objects.exclude(state=Node.State.LOST).filter(last_heartbeat__lt=now - grace):
        if not node_mark_lost(node, silent_since=now - grace):
            continue  # it heartbeated just now
        did = True
        silent = (now - node.last_heartbeat).total_seconds()
        log.warning("node %s lost (silent %.0f s); requeueing its jobs", node.name, silent, extra={"node": node.name})
    for job in Job.objects.filter(node__state=Node.State.LOST, state__in=HOLDING_STATES).select_related("node"):
        node = job.node
        did = True
        silent = now - node.last_heartbeat if node.last_heartbeat else grace
        reason = (f"node {node.name} stopped reporting for {silent.total_seconds():.0f} s" if silent >= grace
                  else f"the worker on node {node.name} stopped")
        attempt_end(job, reason=reason, now=now)
    return did


def reap_silent_attempts(now: datetime | None = None) -> bool:
    """Running attempts whose monitor stopped heartbeating while the node lives (the work-horse died).

    Only on a node that is still reporting (or already lost). When the node is silent too,
    the whole worker may have died: that is one fault, and the lost-node reaper handles it
    when the node's grace ends. Reaping the attempt here first would requeue it while its
    dead node still counted as alive, and the node's loss would then requeue it again.
    """
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.NODE_GRACE_S)
    did = False
    for job in Job.objects.filter(state=JobState.RUNNING, heartbeat_at__lt=cutoff).select_related("node"):
        node = job.node
        if node is not None and node.state != Node.State.LOST and not node.is_responsive(now):
            continue  # the node is suspected: reap_lost_nodes decides
        did = True
        attempt_end(job, reason=f"attempt {job.attempt} stopped reporting on {job.node} "
                                 f"for {(now - job.heartbeat_at).total_seconds():.0f} s", now=now)
    return did


def attempt_end(job: Job, *, reason: str, now: datetime) -> None:
    """An attempt died with its infrastructure: say so in the scheduler's log; jobs.services requeues
    it (or cancels it if that was asked)."""
    log.warning("job %s attempt %d ended without its worker: %s", job.pk, job.attempt, reason,
                extra={"job_id": str(job.pk), "attempt": job.attempt, "node": getattr(job.node, "name", None)})
    attempt_lost(job, reason=reason, now=now)


def repair_dispatch(now: datetime | None = None) -> bool:
    """Re-enqueue starting jobs that will not be started from Redis: lost, flushed, never
    sent, or taken by a worker that died before starting them (dispatch.undelivered).

    ``dispatched_at`` is null when the scheduler died between committing the allocation
    and enqueueing; otherwise give RQ ``DISPATCH_REPAIR_S`` before asking it, and a worker
    as long again after it took the job. Delivering twice is harmless: the worker's fenced
    start lets only one run.
    """
    now = now or timezone.now()
    stale = now - timedelta(seconds=settings.DISPATCH_REPAIR_S)
    did = False
    for job in Job.objects.filter(state=JobState.STARTING).select_related("node"):
        why = "it was never enqueued (the scheduler died, or Redis was down)"
        if job.dispatched_at is not None:
            if job.dispatched_at > stale:
                continue
            why = undelivered(job, taken_before=stale)
            if not why:
                continue
        dispatch(job)
        job_dispatched(job, at=now)
        job_event(job, "redispatched", f"attempt {job.attempt} re-enqueued on {job.node.name}: {why}")
        did = True
    return did


class ClaimAbandoned(Exception):
    """A planned start whose claim or victims' requeue failed: its savepoint is rolled back."""


def plan_and_start(now: datetime | None = None, token: int | None = None, rows: QueueRows | None = None) -> bool:
    """Run the policy and act on its plan.

    1. Build the ClusterState from the database and call the pure policy.
    2. In one transaction fenced by the leader's ``token`` (apps.scheduling.leader): claim
       each planned start (queued → starting, with its GPU slots) in a savepoint together
       with the requeues of the jobs it preempts (victims stop at their next epoch end; the
       node's GPU locks hold the new attempt until they have). A claim another scheduler or
       a stale plan beat, or whose victim cannot be requeued, is abandoned with its requeues.
    3. After commit, enqueue what was claimed.
    4. Store every waiting job's position, ETA, priority factors and reason.

    All of it with the cyclic garbage collector paused (``policy.gc_paused``): at a long
    queue the pass builds tens of thousands of short-lived objects.

    ``rows``: the scheduler's queue kept from its previous pass (inputs.QueueRows), trusted
    only while ``token`` is the same and every pass since has ended well; else the queue is
    read whole.
    """
    if rows is not None and rows.token != token:
        rows.clear()
        rows.token = token
    with policy.gc_paused():
        try:
            return _plan_and_start(now, token, rows)
        except BaseException:
            if rows is not None:
                rows.clear()  # a claim or a write-back may have half happened: read it all again
            raise


def _plan_and_start(now: datetime | None, token: int | None, rows: QueueRows | None) -> bool:
    now = now or timezone.now()
    state, jobs_by_id = cluster_state(now, rows)
    if not state.queued:
        return False
    plan = policy.plan(state, now.timestamp())

    victims_of: dict[str, list[policy.Preemption]] = {}
    for preemption in plan.preemptions:
        victims_of.setdefault(preemption.by_job_id, []).append(preemption)
    nodes = {n.name: n for n in Node.objects.filter(name__in={s.node for s in plan.starts})}
    started = []
    with fenced(token):
        for index, start in enumerate(plan.starts):
            if index == 1:
                fault_point("mid_claim")  # dies inside the claim transaction: nothing of it may remain
            job = jobs_by_id[start.job_id]
            try:
                with transaction.atomic():  # a start and the requeues of its victims: all or nothing
                    for preemption in victims_of.get(start.job_id, ()):
                        victim = Job.objects.filter(pk=preemption.job_id, state=JobState.RUNNING).first()
                        if victim is None or victim.cancel_requested_at or not attempt_preempt(
                            victim, reason=preemption.reason, now=now, grace_s=preemption.grace_s
                        ):
                            raise ClaimAbandoned(f"victim {preemption.job_id} is no longer running")
                    if not job_claim(job, node=nodes[start.node], gpu_indices=list(start.gpu_indices),
                                     gpu_share=start.gpu_share, run_class=start.priority_class or job.priority_class):
                        raise ClaimAbandoned(f"{job.pk} is no longer queued as planned (placed meanwhile, or its resources were edited)")
            except ClaimAbandoned as why:
                log.info("start of %s abandoned: %s", job.pk, why, extra={"job_id": str(job.pk)})
                continue
            started.append(job.pk)
    fault_point("after_allocate")
    for job in Job.objects.filter(pk__in=started).select_related("node"):
        try:
            dispatch(job)
        except redis.RedisError as exc:
            log.warning("enqueue of %s failed (%s); repair will retry", job.pk, exc,
                        extra={"job_id": str(job.pk), "attempt": job.attempt, "node": job.node.name})
            continue
        job_dispatched(job, at=timezone.now())
        demoted = job.run_class != job.priority_class
        job_event(job, "scheduled", f"placed on {job.node.name} GPU {','.join(map(str, job.gpu_indices))}"
                                    f"{f' ({job.gpu_share:g} share)' if job.gpu_share < 1 else ''}"
                                    f"{f'; runs as {job.run_class}: beyond the team urgent allowance (urgent GPU-hours per day, counting this job timeout, or concurrent urgent GPUs)' if demoted else ''}")

    queue_update(plan.queue, jobs_by_id, now)
    return bool(started) or bool(plan.preemptions)


# An ETA that moved less than this, or less than ETA_SLACK_FRACTION of the time still to wait
# for it, is not news: an ETA two days out drifting by minutes is not worth rewriting (at
# 10,000 queued nearly every stored ETA drifted past a fixed 30 s between passes: the
# forward simulation's draws are `now + left·e^g`, and `now` moves).
ETA_SLACK_S = 30.0
ETA_SLACK_FRACTION = 0.05
# Clock times in reasons ("expected 14:20 UTC", "2026-12-04 09:10 UTC") follow the ETA: they
# are compared masked, so a minute rolling over is not news while the ETA fields are not.
CLOCK_IN_REASON = re.compile(r"(?:\d{4}-\d{2}-\d{2} )?\d{2}:\d{2} UTC")
# Priority points: the age factor alone adds weight_age / age_cap_s points per second
# (~0.003 with the defaults), so a score compared exactly changes on every pass.
PRIORITY_SLACK = 1.0


def queue_update(entries, jobs_by_id, now: datetime | None = None) -> int:
    """Store each waiting job's position, ETA, reason and priority — only where they changed.

    Every pass re-plans the whole queue; writing every row each time would be one UPDATE
    per queued job every few seconds. An ETA that moved less than ``ETA_SLACK_S`` or
    ``ETA_SLACK_FRACTION`` of its distance from ``now``, a reason that differs only in its
    clock times, a priority that moved less than ``PRIORITY_SLACK`` points and factors that
    moved in the third decimal are not news. A position is: one start or arrival ahead moves
    everyone behind it, so the changed rows are written together (``job_queue_info_set``).
    A row whose only news is its position or its reason (which says how many jobs are ahead,
    and names the same clock time) gets those two alone: after an arrival at the head of
    10,000 jobs, about half the rows, and most of the write's CPU was converting the other
    fields' values (timestamps, JSON). Any other news rewrites all its fields (:func:`_news`
    decides which, on floats). The jobs in ``jobs_by_id`` then hold what was written (a
    scheduler's QueueRows keeps them for its next pass). Returns the rows written.
    """
    now = now or timezone.now()
    now_s = now.timestamp()
    now_us = (now - EPOCH) // ONE_US
    decided = []
    for entry in entries:
        job = jobs_by_id.get(entry.job_id)
        if job is not None:
            decided.append([entry, job, _news(job, entry, now_s, now_us)])
    keep_shown_order(decided)
    updates = []
    for entry, job, news in decided:
        if news == NO_NEWS:
            continue  # most rows of a steady pass
        if news == POSITION_NEWS:
            updates.append((job, {"queue_position": entry.position, "reason": entry.reason[:300]}))
            continue
        updates.append((job, queue_row(job, entry)))
    written = job_queue_info_set([(job.pk, news) for job, news in updates])
    for job, news in updates:
        for name, value in news.items():
            setattr(job, name, value)
    return written


def keep_shown_order(decided: list) -> None:
    """Where two neighbours in the queue are in order in the pass but their point ETAs, as they
    would be stored, are not (one rewritten, the other kept within the slack), mark both
    ``ALL_NEWS`` (``decided``: [entry, job, news] in queue order, changed in place).

    A kept ETA may be up to ``ETA_SLACK_S`` (or ``ETA_SLACK_FRACTION``) stale: position 1's row
    rewritten for other news at +65 s while position 2 kept +50 s showed "start in 16 s" above
    "start in 9 s" on one GPU (trial25 F1). Pairs the pass itself has out of order (a small job
    backfilling ahead of a big one) are left as they are. Marking a pair fresh can unsettle the
    pair before it, so the walk repeats until nothing changes (once in a steady pass: one float
    comparison per row, the kept rows' stored ETA read once).
    """
    shown_kept = [None if news == ALL_NEWS or job.estimated_start_at is None else job.estimated_start_at.timestamp()
                  for _, job, news in decided]
    changed = True
    while changed:
        changed = False
        before = None  # (index, the pass's point, the point as stored) of the previous row with one
        for i, row in enumerate(decided):
            point = row[0].estimated_start
            if point is None:
                before = None
                continue
            shown = point if row[2] == ALL_NEWS else shown_kept[i]
            if before is not None and before[1] <= point and before[2] > shown:
                for k in (before[0], i):
                    if decided[k][2] != ALL_NEWS:
                        decided[k][2] = ALL_NEWS
                        changed = True
                shown = point
            before = (i, point, shown)


def queue_row(job: Job, entry: policy.QueueEntry) -> dict:
    """Every planner field of ``job`` as ``entry`` sets it (the first ETAs kept once set)."""
    eta, low, high = (None if t is None else datetime.fromtimestamp(t, tz=UTC)
                      for t in (entry.estimated_start, entry.estimated_start_low, entry.estimated_start_high))
    return {
        "queue_position": entry.position,
        "estimated_start_at": eta,
        "estimated_start_low_at": low,
        "estimated_start_high_at": high,
        "reason": entry.reason[:300],
        "priority_score": round(entry.priority, 3),
        "priority_factors": {k: round(v, 3) for k, v in entry.factors.items()},
        "predicted_start_at": job.predicted_start_at or eta,
        "predicted_model_start_at": job.predicted_model_start_at or (
            eta if entry.estimated_start_model is None else datetime.fromtimestamp(entry.estimated_start_model, tz=UTC)),
    }


NO_NEWS, POSITION_NEWS, ALL_NEWS = "none", "position", "all"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ONE_US = timedelta(microseconds=1)


def _news(job: Job, entry: policy.QueueEntry, now_s: float, now_us: int) -> str:
    """What of ``entry`` is news against the stored ``job``: ``NO_NEWS``; ``POSITION_NEWS``
    (its position or reason changed, the reason naming the same clock times: those two are
    written); ``ALL_NEWS`` (anything else: every field is written).

    Decided on the entry's floats without making a datetime or a dict (a steady pass at
    10,000 queued made three datetimes and a dict per row to find that nothing changed:
    most of its write-back's time), yet exactly as if the new ETAs were the datetimes
    written (rounded to the microsecond): see :func:`_same_eta`. It checks each of
    ``QUEUE_INFO_FIELDS`` itself: a field added there must be added here (a test says so).
    """
    if not abs(job.priority_score - round(entry.priority, 3)) < PRIORITY_SLACK:
        return ALL_NEWS
    for old, new in ((job.estimated_start_at, entry.estimated_start),
                     (job.estimated_start_low_at, entry.estimated_start_low),
                     (job.estimated_start_high_at, entry.estimated_start_high)):
        if old is None or new is None:
            if old is not new:
                return ALL_NEWS
        elif not _same_eta(old, new, now_s, now_us):
            return ALL_NEWS
    # predicted_*: the first ETA, kept once set; unset, it would be set now unless there is none
    if job.predicted_start_at is None and entry.estimated_start is not None:
        return ALL_NEWS
    if job.predicted_model_start_at is None and (entry.estimated_start is not None
                                                 or entry.estimated_start_model is not None):
        return ALL_NEWS
    if job.priority_factors != {k: round(v, 3) for k, v in entry.factors.items()}:
        return ALL_NEWS
    reason = entry.reason[:300]
    same_reason = job.reason == reason
    if job.queue_position == entry.position and (same_reason or (
            # clock times alone moved: they follow the ETA, which is not news (without an
            # ETA, a quota's "until" is compared as it is)
            entry.estimated_start is not None
            and CLOCK_IN_REASON.sub("", job.reason) == CLOCK_IN_REASON.sub("", reason))):
        return NO_NEWS
    if same_reason or CLOCK_IN_REASON.findall(job.reason) == CLOCK_IN_REASON.findall(reason):
        return POSITION_NEWS  # the position, or how many jobs are ahead, with the same clock times
    # The reason names other clock times than the stored ETA's: the ETA goes with it (the
    # row stays consistent).
    return ALL_NEWS


def _same_eta(old: datetime, new: float, now_s: float, now_us: int) -> bool:
    """Whether the stored ETA ``old`` and the planned ``new`` (seconds) are the same ETA:
    closer than ``ETA_SLACK_S`` or ``ETA_SLACK_FRACTION`` of ``old``'s distance from now.

    On floats; within 10 µs of the slack's edge, where float error and the microsecond
    rounding of the datetime that would be stored could tip it, in integer microseconds
    exactly as the datetimes compare: ``datetime.fromtimestamp`` rounds half to even
    (CPython's ``_PyTime_ROUND_HALF_EVEN``) after splitting off the whole seconds, and
    ``timedelta.total_seconds`` is the microseconds divided exactly.
    """
    old_s = old.timestamp()
    slack = (old_s - now_s) * ETA_SLACK_FRACTION
    if slack < ETA_SLACK_S:
        slack = ETA_SLACK_S
    moved = abs(old_s - new)
    if moved < slack - 1e-5:
        return True
    if moved > slack + 1e-5:
        return False
    old_us = (old - EPOCH) // ONE_US
    frac, whole = math.modf(new)
    new_us = int(whole) * 1_000_000 + round(frac * 1e6)
    slack = max(ETA_SLACK_S, ETA_SLACK_FRACTION * ((old_us - now_us) / 1_000_000))
    return abs(old_us - new_us) / 1_000_000 < slack


def tick(now: datetime | None = None, token: int | None = None, rows: QueueRows | None = None) -> bool:
    """One full pass. Reaping and repairs first, so freed GPUs are planned in the same pass;
    then the sweeps' step (apps.sweeps), so the trials it submits are planned in it too.

    ``token`` is the leader's fencing token (apps.scheduling.leader); claims are made only
    while it is the newest; ``rows``: the leader's queue kept between its passes
    (inputs.QueueRows). The sweep step needs no fencing: its writes are keyed and
    conditional (docs/sweeps.md).
    """
    did = reap_lost_nodes(now)
    did |= reap_silent_attempts(now)
    if sweeps_advance(now):
        did = True
        fault_point("after_sweep_step")  # trials just committed, not yet planned: the next scheduler must place them
    try:
        did |= repair_dispatch(now)
        did |= plan_and_start(now, token, rows)
    except redis.RedisError as exc:
        if connection_error_of(exc) is not None:
            redis_unreachable(exc)  # the process's one line for the outage, its "back" to follow
        else:
            log.warning("Redis unavailable (%s); jobs stay in the database and are dispatched once it is back", exc)
    return did


__all__ = ["tick", "plan_and_start", "repair_dispatch", "reap_lost_nodes", "reap_silent_attempts", "sweeps_advance"]
