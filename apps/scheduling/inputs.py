"""Building the policy's plain inputs (ClusterState) from the database.

Usage comes from the ledger (``UsageRecord``, one row per finished attempt) plus what
running attempts have consumed so far. Decay is computed on hourly buckets, so a pass
costs one grouped query however long the ledger grows.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime, timedelta

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Count, F, FloatField, Func, IntegerField, QuerySet, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from apps.accounts.models import Team
from apps.cluster.models import ForeignAllocation, Node, storage_problem_said
from apps.jobs.models import HOLDING_STATES, QUEUE_INFO_FIELDS, Job, JobEvent, JobState
from apps.quotas.models import TeamQuota, UsageRecord

from .estimates import (
    dataset_images,
    estimate_basis,
    fit_generation,
    fit_runtime_model,
    job_estimates,
    runtime_estimate,
)
from .models import SchedulerConfig
from .policy import (
    DEFAULT_RUNTIME_S,
    Allocation,
    ClusterState,
    DecayedUsage,
    GpuInfo,
    JobRequest,
    NodeInfo,
    PolicyConfig,
    RollingUsage,
    TeamPolicy,
    runtime_limit,
)
from .policy.eta_calibration import HISTORY_MAX_WAIT_S, HISTORY_N, HISTORY_S
from .policy.runtime_model import RuntimeModel

DAY = timedelta(days=1)


def cluster_nodes(nodes: Iterable[Node]) -> tuple[NodeInfo, ...]:
    """Nodes and their GPUs as the policy sees them (a draining or lost node, or one whose worker
    cannot reach the shared storage, is not schedulable).

    A real GPU carries the free memory its node last measured (pynvml); a node lists the
    images it runs (a node that registered none runs only jobs that name no image). A node
    whose GPUs are real offers the feature ``cuda`` besides those it advertises (what an FP16
    TorchScript export needs: apps.jobs.spec.export_requires); a simulated one runs on its CPUs.
    """
    return tuple(
        NodeInfo(
            name=n.name,
            gpus=tuple(GpuInfo(g.index, g.model, g.memory_mb,
                               memory_free_mb=None if g.simulated else max(0, g.memory_mb - g.memory_used_mb))
                       for g in n.gpus.all()),
            cpu_milli=n.cpu_count * 1000,
            memory_mb=n.memory_mb,
            schedulable=n.takes_work,
            unschedulable_because=("" if n.takes_work
                                   else f"{n.state}: {n.drain_reason}" if n.drain_reason
                                   else storage_problem_said(n.storage_problem) if n.storage_problem else n.state),
            images=frozenset(n.images or ()),
            features=tuple(n.features or ()) + (() if n.simulated else ("cuda",)),
            whole_gpus_only=n.executor == Node.Executor.SLURM,
        )
        for n in nodes
    )


def service_history(jobs: Iterable[Job]) -> dict:
    """Requeued jobs' service so far: job pk -> (seconds of progress kept, times preempted)."""
    pks = [j.pk for j in jobs]
    if not pks:
        return {}
    gpus = {j.pk: max(j.gpus, 1e-9) for j in jobs}
    served = dict(UsageRecord.objects.filter(job_id__in=pks).values_list("job_id").annotate(s=Sum("gpu_seconds")))
    preempted = dict(JobEvent.objects.filter(job_id__in=pks, kind="preempted").values_list("job_id")
                     .annotate(n=Count("id")))
    return {pk: (served.get(pk, 0.0) / gpus[pk], preempted.get(pk, 0)) for pk in pks}


# What a pass reads of a job that is not running: its request and what its runtime estimate
# needs (job_estimates). Of a queued job also the planner's last view (loop.queue_update compares).
REQUEST_FIELDS = ("id", "team_id", "user_id", "created_at", "gpus", "priority_class", "gpu_memory_mb", "spec",
                  "cpu_milli", "memory_mb", "timeout_s", "attempt", "attempt_id", "epochs_done")


def lean(jobs: QuerySet[Job], *also: str) -> QuerySet[Job]:
    """``jobs`` with only ``REQUEST_FIELDS`` (and ``also``) loaded, ``team_slug`` and ``username`` beside them.

    A queued job's row has ~50 columns (the raw spec, a dozen timestamps) and
    ``select_related`` built a Team and a User instance per row: at 10,000 queued that was
    most of a live pass. Any other field of these instances is read from the database when
    first touched, one query per row (tests/scheduling/test_queue_update.py counts a pass's
    queries): the claim uses only the pk and attempt id, dispatch reads the started jobs again.
    """
    return jobs.only(*REQUEST_FIELDS, *also).annotate(team_slug=F("team__slug"), username=F("user__username"))


ARRIVALS_LIMIT = 500  # the newest this many of the last day's submits


def recent_arrivals(now: datetime, model: RuntimeModel | None, rows: QueueRows | None = None) -> tuple[JobRequest, ...]:
    """Jobs submitted in the last day, newest first (at most ``ARRIVALS_LIMIT``): the inflow
    the ETA ranges expect to continue. ``rows``: a scheduler's QueueRows, whose kept
    requests are reused (``QueueRows.arrivals``)."""
    return (rows if rows is not None else QueueRows()).arrivals(now, model)


def arrival_request(job: Job, walltime_s: float | None) -> JobRequest:
    return JobRequest(job_id=str(job.pk), team=job.team_slug, user=job.username,
                      submitted_at=job.created_at.timestamp(), gpus=job.gpus, priority_class=job.priority_class,
                      gpu_models=tuple(job.spec.get("gpu_models") or ()), image=job.spec.get("image") or "",
                      timeout_s=float(job.timeout_s), walltime_s=walltime_s)


def eta_history(now: datetime) -> tuple[tuple[float, float], ...]:
    """(predicted wait, actual wait) of jobs that first started within ``HISTORY_S``, oldest first.

    The ETAs' track record (policy/eta_calibration.py): the model's first point for a job
    (``predicted_model_start_at``, kept from its first queued pass; rows from before it
    existed have only ``predicted_start_at``, then uncalibrated) against its first start,
    both from its submit. Jobs that started in their first pass have no prediction and are
    not in it, and neither is a job that waited longer than ``HISTORY_MAX_WAIT_S``, as in
    the simulator.

    The waits are computed by the database (:class:`SecondsBetween`): this runs every pass,
    and converting three timestamps of each of ``HISTORY_N`` rows to datetimes in Python was
    most of its cost (bench database: 19 ms at 1,000 rows, 39 ms at 3,000 on SQLite; now 16 ms
    at 3,000).
    """
    # created_at bounds the scan through its index (first_started_at has none).
    rows = (Job.objects.filter(created_at__gte=now - timedelta(seconds=HISTORY_S + HISTORY_MAX_WAIT_S),
                               first_started_at__gte=now - timedelta(seconds=HISTORY_S),
                               predicted_start_at__isnull=False)
            .annotate(predicted=SecondsBetween(Coalesce("predicted_model_start_at", "predicted_start_at"),
                                               "created_at"),
                      waited=SecondsBetween("first_started_at", "created_at"))
            .filter(waited__lte=HISTORY_MAX_WAIT_S)
            .order_by("-first_started_at").values_list("predicted", "waited")[:HISTORY_N])
    return tuple((predicted if predicted > 0.0 else 0.0, waited if waited > 0.0 else 0.0)
                 for predicted, waited in reversed(rows))


def team_policies(config: PolicyConfig) -> dict[str, TeamPolicy]:
    quotas = {q.team_id: q for q in TeamQuota.objects.all()}
    default = config.default_team
    policies = {}
    def pick(quota: TeamQuota | None, field: str, fallback):
        value = getattr(quota, field, None) if quota else None
        return fallback if value is None else value

    for team in Team.objects.all():
        quota = quotas.get(team.pk)

        policies[team.slug] = TeamPolicy(
            shares=team.shares if team.shares > 0 else 1.0,
            max_gpus=pick(quota, "max_gpus", default.max_gpus),
            urgent_gpu_hours_per_day=pick(quota, "urgent_gpu_hours_per_day", default.urgent_gpu_hours_per_day),
            urgent_max_gpus=pick(quota, "urgent_max_gpus", default.urgent_max_gpus),
            max_gpus_per_job=pick(quota, "max_gpus_per_job", default.max_gpus_per_job),
            user_gpu_hours_per_day=pick(quota, "user_gpu_hours_per_day", default.user_gpu_hours_per_day),
        )
    return policies


class EpochHour(Func):
    """Whole hours since 1970 (UTC) of a timestamp, computed by the database itself.

    ``TruncHour`` on SQLite calls a Python function for every row (and makes a datetime of
    each bucket): with 30,000 usage records in the decay horizon, 230 ms of every pass.
    SQLite reads a stored time to the millisecond (a record ending in the last half
    millisecond of an hour counts in the next hour: a decay difference of ~4 parts in 10,000
    for that record).
    """

    output_field = IntegerField()

    def as_sqlite(self, compiler, connection, **extra):
        # %%%%s: the template's % formatting, then the cursor's, each take one level.
        template = "(CAST(strftime('%%%%s', %(expressions)s) AS INTEGER) / 3600)"
        return self.as_sql(compiler, connection, template=template, **extra)

    def as_postgresql(self, compiler, connection, **extra):
        template = "FLOOR(EXTRACT(EPOCH FROM %(expressions)s) / 3600)::integer"
        return self.as_sql(compiler, connection, template=template, **extra)


class SecondsBetween(Func):
    """``end - start`` in seconds (a float), computed by the database: no timestamp of the row
    is made a datetime in Python. SQLite reads a stored time to about a millisecond here."""

    arity = 2
    output_field = FloatField()

    def __init__(self, end, start, **extra) -> None:
        super().__init__(end, start, **extra)

    def as_sqlite(self, compiler, connection, **extra):
        return self.as_sql(compiler, connection, template="((julianday(%(expressions)s)) * 86400.0)",
                           arg_joiner=") - julianday(", **extra)

    def as_postgresql(self, compiler, connection, **extra):
        return self.as_sql(compiler, connection, template="EXTRACT(EPOCH FROM %(expressions)s)::float8",
                           arg_joiner=" - ", **extra)


def usage_inputs(config: PolicyConfig, holding: list[Job], now: datetime):
    """Decayed usage per (team, user), rolling 24 h per user, urgent 24 h per team."""
    decayed = DecayedUsage(config.half_life_s)
    horizon = now - timedelta(seconds=config.half_life_s * 10)
    buckets = (UsageRecord.objects.filter(ended_at__gte=horizon)
               .annotate(hour=EpochHour("ended_at"))
               .values_list("team__slug", "user__username", "hour")
               .annotate(total=Sum("gpu_seconds")).order_by("hour"))
    for team, user, hour, total in buckets:
        decayed.add((team, user), total, at=hour * 3600.0)

    rolling_user = RollingUsage()
    urgent_team: dict[str, float] = defaultdict(float)
    window_start = now - DAY
    recent = (UsageRecord.objects.filter(ended_at__gt=window_start)
              .values_list("user__username", "team__slug", "priority_class", "gpu_seconds", "started_at", "ended_at")
              .order_by("ended_at"))
    for user, team, run_class, gpu_seconds, started, ended in recent:
        # Only the part of the attempt inside the window counts against the 24 h quota.
        span = max((ended - started).total_seconds(), 1e-9)
        inside = gpu_seconds * min(1.0, (ended - max(started, window_start)).total_seconds() / span)
        rolling_user.add(user, inside, at=ended.timestamp())
        if run_class == "urgent":
            urgent_team[team] += inside
    for job in holding:
        if job.started_at is None:
            continue
        started = max(job.started_at, window_start)
        consumed = job.gpus * max(0.0, (now - job.started_at).total_seconds())
        decayed.add((job.team.slug, job.user.username), consumed, at=now.timestamp())
        inside = job.gpus * max(0.0, (now - started).total_seconds())
        rolling_user.add(job.user.username, inside, at=now.timestamp())
        if (job.run_class or job.priority_class) == "urgent":
            urgent_team[job.team.slug] += inside
    t = now.timestamp()
    users = rolling_user.keys()
    return (
        decayed.snapshot(t),
        {u: rolling_user.total(u, t) for u in users},
        {u: rolling_user.expiries(u, t) for u in users},
        dict(urgent_team),
    )


def foreign_allocations(now: datetime) -> list[Allocation]:
    """Work the portal did not start (Slurm jobs submitted directly): occupied, never preempted."""
    out = []
    for row in ForeignAllocation.objects.select_related("node"):
        started = (row.started_at or now).timestamp()
        end = row.ends_at.timestamp() if row.ends_at else now.timestamp() + DAY.total_seconds()
        out.append(Allocation(
            job_id=f"outside:{row.node.name}:{row.external_id}", team="", user="", node=row.node.name,
            gpu_indices=tuple(row.gpu_indices), cpu_milli=row.cpu_milli, memory_mb=row.memory_mb,
            priority_class="medium", started_at=started, expected_end=max(now.timestamp() + 1, end),
            preemptible=False, ends_by=row.ends_at.timestamp() if row.ends_at else math.inf,
        ))
    return out


def queued_request(job: Job, walltime_s: float | None, history: tuple[float, int]) -> JobRequest:
    spec = job.spec
    return JobRequest(
        job_id=str(job.pk), team=job.team_slug, user=job.username,
        submitted_at=job.created_at.timestamp(), gpus=job.gpus, priority_class=job.priority_class,
        gpu_memory_mb=job.gpu_memory_mb, gpu_models=tuple(spec.get("gpu_models") or ()),
        cpu_milli=job.cpu_milli, memory_mb=job.memory_mb, image=spec.get("image") or "",
        timeout_s=float(job.timeout_s), requires=tuple(spec.get("requires") or ()),
        walltime_s=walltime_s, preemptible=spec.get("preemptible", True),
        attained_s=history[0], preemptions=history[1],
    )


# What another process may change of a job while it stays queued, beside its state: a
# requeue gives it a new attempt_id (a CUDA-OOM retry a new batch in its spec with it), a
# manager its class, a superuser's admin edit its resources or owner; a late epoch report of
# its previous attempt its epochs_done. A row whose key is unchanged is not read again.
ROW_KEY_FIELDS = ("attempt_id", "attempt", "priority_class", "gpus", "gpu_memory_mb", "cpu_milli", "memory_mb",
                  "timeout_s", "epochs_done", "team", "user")
# Everything is read afresh this often all the same: what the key leaves out (a superuser's
# edit of a queued job's spec, a team's new slug, a dataset's new image count) and queue
# fields written by a scheduler that lost the lease mid-pass show within this time.
QUEUE_ROWS_MAX_AGE_S = 60.0
BY_PK_AT_MOST = 1000  # more new rows than this: one read of the whole queue instead of pk IN (…)
BY_PK_CHUNK = 500


class QueueRows:
    """A scheduler's queued jobs, kept between its passes.

    At 10,000 queued, reading the queue was most of a live pass (≈ 1.4 of 2.6 s of CPU: the
    ORM converting ~25 columns of every row — timestamps, JSON, uuids — and the runtime
    estimate and request of each), though from one pass to the next almost no row changes.
    Each pass now reads only the queued rows' keys (``ROW_KEY_FIELDS``, raw: no conversion),
    and the rows, estimates and requests of new or changed keys; a job that left the queue
    drops out. The planner's own fields (``QUEUE_INFO_FIELDS``) are kept as
    ``loop.queue_update`` wrote them. The runtime estimates are made again whenever the
    model is fitted again (a job succeeded), and everything is read afresh every
    ``QUEUE_ROWS_MAX_AGE_S``, after any failed pass and when the leader's token changes
    (``loop.plan_and_start``), so a row is never trusted across another scheduler's passes.
    The recent arrivals (the ETAs' inflow) are kept the same way (:meth:`arrivals`).

    ``cluster_state`` without one reads everything, as a one-off pass must.
    """

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.rows: dict = {}  # raw pk -> (key, job, estimates.Basis, JobRequest)
        self.fitted: object = None  # estimates.fit_generation() the requests were estimated under
        self.read_at = -math.inf  # time.monotonic() of the last whole read
        self.token: int | None = None
        self.arrival_rows: dict = {}  # pk -> (key, estimates.Basis, JobRequest) of recent_arrivals
        self.arrivals_fitted: object = None
        self.arrivals_read_at = -math.inf

    def read(self, model: RuntimeModel | None) -> tuple[dict[str, Job], tuple[JobRequest, ...]]:
        """The queued jobs by id and their requests, in the database's order."""
        conn = connections[DEFAULT_DB_ALIAS]
        meta = Job._meta
        qn = conn.ops.quote_name
        columns = ", ".join(qn(meta.get_field(name).column) for name in ("id", *ROW_KEY_FIELDS))
        with conn.cursor() as cursor:
            cursor.execute(f"SELECT {columns} FROM {qn(meta.db_table)} "
                           f"WHERE {qn(meta.get_field('state').column)} = %s", [str(JobState.QUEUED)])
            keys = [(row[0], row[1:]) for row in cursor.fetchall()]
        if time.monotonic() - self.read_at > QUEUE_ROWS_MAX_AGE_S:
            self.rows = {}
        kept = self.rows
        new = {raw for raw, key in keys if raw not in kept or kept[raw][0] != key}
        # A whole read replaces every kept row too (and restarts the QUEUE_ROWS_MAX_AGE_S clock).
        loaded = self._load(new, whole=len(new) > BY_PK_AT_MOST or not kept, conn=conn) if new else {}
        images = dataset_images(loaded.values()) if loaded else {}
        history = service_history([j for j in loaded.values() if j.attempt > 1])
        fitted = fit_generation()
        again = fitted is not self.fitted  # a job succeeded: every estimate is made again
        by_mode: dict[str, float | None] = {}
        rows = {}
        for raw, key in keys:
            if raw in loaded:
                job = loaded[raw]
                basis = estimate_basis(job, images)
                request = queued_request(job, runtime_estimate(basis, model, by_mode), history.get(job.pk, (0.0, 0)))
            elif raw in kept and raw not in new:
                _, job, basis, request = kept[raw]
                if again:
                    request = request.with_walltime(runtime_estimate(basis, model, by_mode))
            else:
                continue  # it left the queue between the two reads
            rows[raw] = (key, job, basis, request)
        self.rows, self.fitted = rows, fitted
        return ({request.job_id: job for _, job, _, request in rows.values()},
                tuple(request for *_, request in rows.values()))

    def arrivals(self, now: datetime, model: RuntimeModel | None) -> tuple[JobRequest, ...]:
        """:func:`recent_arrivals`, reading only the rows that are new or changed since the
        last pass (the key ``ROW_KEY_FIELDS``, as the queue's; their estimates made again when
        the model is fitted again; everything read afresh every ``QUEUE_ROWS_MAX_AGE_S``).
        Reading and estimating the 500 newest jobs every pass was ~a quarter of the live
        pass's input building at 10,000 queued (48 of 178 ms of CPU, SQLite)."""
        keys = list(Job.objects.filter(created_at__gte=now - DAY).order_by("-created_at")
                    .values_list("pk", *ROW_KEY_FIELDS)[:ARRIVALS_LIMIT])
        if time.monotonic() - self.arrivals_read_at > QUEUE_ROWS_MAX_AGE_S:
            self.arrival_rows, self.arrivals_read_at = {}, time.monotonic()
        kept = self.arrival_rows
        new = [pk for pk, *key in keys if pk not in kept or kept[pk][0] != key]
        loaded = {j.pk: j for j in lean(Job.objects.filter(pk__in=new))} if new else {}
        images = dataset_images(loaded.values()) if loaded else {}
        fitted = fit_generation()
        again = fitted is not self.arrivals_fitted
        by_mode: dict[str, float | None] = {}
        rows = {}
        for pk, *key in keys:
            if pk in loaded:
                basis = estimate_basis(loaded[pk], images)
                request = arrival_request(loaded[pk], runtime_estimate(basis, model, by_mode))
            elif pk in kept and kept[pk][0] == key:
                _, basis, request = kept[pk]
                if again:
                    request = request.with_walltime(runtime_estimate(basis, model, by_mode))
            else:
                continue  # deleted between the two reads
            rows[pk] = (key, basis, request)
        self.arrival_rows, self.arrivals_fitted = rows, fitted
        return tuple(request for *_, request in rows.values())

    def _load(self, raws: set, *, whole: bool, conn) -> dict:
        """raw pk -> Job for those of ``raws`` still queued; when ``whole``, for every queued job."""
        queued = lean(Job.objects.filter(state=JobState.QUEUED), *QUEUE_INFO_FIELDS)
        if whole:
            jobs = list(queued)
            self.read_at = time.monotonic()
        else:
            pks = list(raws)
            jobs = [job for at in range(0, len(pks), BY_PK_CHUNK)
                    for job in queued.filter(pk__in=pks[at:at + BY_PK_CHUNK])]
        raw_of = Job._meta.pk.get_db_prep_value  # the value as the database returns it (uuid hex on SQLite)
        return {raw: job for job in jobs if (raw := raw_of(job.pk, conn)) in raws or whole}


def cluster_state(now: datetime | None = None, rows: QueueRows | None = None) -> tuple[ClusterState, dict[str, Job]]:
    """The policy's input, and the queued jobs by id; ``rows``: the queue as kept between a
    scheduler's passes (QueueRows), else it is read whole."""
    now = now or timezone.now()
    config = SchedulerConfig.current().to_policy()
    nodes = list(Node.objects.prefetch_related("gpus"))
    # A suspected node (a few heartbeats missed) gets no new work: an attempt placed on a
    # worker that is in fact dead would be requeued again when the node is declared lost.
    responsive = {n.name for n in nodes if n.is_responsive(now)}
    infos = tuple(
        info if info.name in responsive
        else replace(info, schedulable=False, unschedulable_because=info.unschedulable_because or "not reporting")
        for info in cluster_nodes(nodes)
    )
    holding = list(Job.objects.filter(state__in=HOLDING_STATES, node__isnull=False)
                   .select_related("node", "team", "user"))
    model = fit_runtime_model()
    jobs_by_id, queued = (rows if rows is not None else QueueRows()).read(model)
    estimates = job_estimates([], holding, now, model)
    with_checkpoint = set(Job.objects.filter(pk__in=[j.pk for j in holding], checkpoints__isnull=False)
                          .values_list("pk", flat=True))
    history = service_history([j for j in holding if j.attempt > 1])

    running = []
    for job in holding:
        started = (job.started_at or job.dispatched_at or now).timestamp()
        key = str(job.pk)
        attained, preemptions = history.get(job.pk, (0.0, 0))
        # The worker stops it once its attempts together ran the timeout: it ends by then
        # whatever its epoch rate or the model says (worker.tasks, run_child's budget).
        ends_by = started + runtime_limit(float(job.timeout_s), attained)
        if key in estimates.remaining_s:  # its own epoch rate, once it has finished an epoch
            expected_end = now.timestamp() + estimates.remaining_s[key]
        else:  # never the timeout as an estimate: the model's, else the stated default
            expected_end = started + (estimates.runtime_s.get(key) or DEFAULT_RUNTIME_S)
        expected_end = min(expected_end, ends_by)
        # Clamped to now + 1 s: a job past its model/default estimate before its first epoch (or at
        # its timeout) is "due in a second". This hides how far overdue it is and the estimate it
        # overran, but no consumer on main reads either: each takes max(expected_end, now) (fair,
        # fifo, reservations, preemption's time left, quota, explain's GPU slots, the ETA's forward
        # scenarios: "due now", no draw), so unclamped would plan the same to within that second.
        # The one rule that would use them (reservation_overdue_end) was measured and not landed;
        # landing it means passing the estimate unclamped (docs/scheduling.md "Overdue jobs in
        # reservations").
        running.append(Allocation(
            job_id=key, team=job.team.slug, user=job.user.username, node=job.node.name,
            gpu_indices=tuple(job.gpu_indices), gpu_share=job.gpu_share, gpu_memory_mb=job.gpu_memory_mb,
            cpu_milli=job.cpu_milli, memory_mb=job.memory_mb, priority_class=job.run_class or job.priority_class,
            started_at=started, expected_end=max(now.timestamp() + 1, expected_end),
            preemptible=(job.pk in with_checkpoint and job.state == JobState.RUNNING
                         and job.spec.get("preemptible", True)),
            attained_s=attained, preemptions=preemptions,
            estimated=key in estimates.remaining_s or key in estimates.runtime_s, ends_by=ends_by,
        ))
    running.extend(foreign_allocations(now))
    usage, usage_24h, expiry, urgent = usage_inputs(config, holding, now)
    state = ClusterState(
        nodes=infos, running=tuple(running), queued=queued, config=config, usage=usage,
        user_usage_24h=usage_24h, user_usage_expiry=expiry, team_urgent_usage_24h=urgent,
        teams=team_policies(config), inflow=recent_arrivals(now, model, rows), runtime_sigma=estimates.sigma,
        eta_history=eta_history(now) if config.policy == "fair" and config.eta_coverage > 0 else (),
    )
    return state, jobs_by_id
