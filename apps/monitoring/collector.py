"""The /metrics collector: every value is read at scrape time from the database or Redis.

One web process answers a scrape with what every process wrote: the database holds jobs,
nodes, GPU readings (node heartbeats) and the usage ledger; Redis holds what only the
scheduler and the workers see (apps/monitoring/recorders.py). Nothing is kept in this
process's memory, so any number of web processes answer the same, none needs
``PROMETHEUS_MULTIPROC_DIR``, and per-job series (loss, mAP) disappear with the job
instead of lingering as they would in multiprocess mode.

Labels stay low-cardinality: team, class, node, gpu index, state, outcome, reason —
except the loss/mAP families of *running* jobs (label ``job``), which are bounded by the
number of job slots.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from datetime import timedelta

import redis
from django.conf import settings
from django.db.models import Case, Count, DurationField, ExpressionWrapper, F, OuterRef, Q, Subquery, Sum, When
from django.utils import timezone
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from apps.accounts.models import Membership, Team
from apps.cluster.models import GPU, Node
from apps.core.redis_outage import redis_reachable, redis_use_failed
from apps.jobs.models import HOLDING_STATES, TERMINAL_STATES, Job, JobEvent, JobState, MetricPoint, PriorityClass
from apps.quotas.models import UsageRecord
from apps.scheduling.models import SchedulerConfig

from . import recorders

log = logging.getLogger(__name__)
MIB = 2**20
CLASSES = tuple(PriorityClass.values)
WAIT_BUCKETS_S = (10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 43200, 86400, 259200)
ETA_ERROR_BUCKETS_S = (10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)
# Attempt endings counted by reason (JobEvent kinds written by jobs.services and the worker).
ATTEMPT_END_REASONS = ("succeeded", "failed", "retry", "timed_out", "cancelled", "preempted", "node_lost",
                       "requeued")
# A queued job's wait compared with its first ETA; short estimates are floored so that a
# job promised "in 5 s" that starts after 20 s does not look 4x late.
ETA_RATIO_FLOOR_S = 60.0
LOSS_KEYS = {"box": "train/box_loss", "cls": "train/cls_loss", "dfl": "train/dfl_loss", "seg": "train/seg_loss",
             "pose": "train/pose_loss"}
MAP_KEYS = {"50": ("metrics/mAP50(B)", "metrics/mAP50(M)", "metrics/mAP50(P)"),
            "50-95": ("metrics/mAP50-95(B)", "metrics/mAP50-95(M)", "metrics/mAP50-95(P)")}


def metric_names() -> set[str]:
    """Every sample name /metrics can export (histograms with their _bucket/_sum/_count):
    the dashboard and rule tests check against this list, not against one scrape's data."""
    names = set()
    for family in YoloportalCollector().families().values():
        if family.type == "histogram":
            names |= {family.name + s for s in ("_bucket", "_sum", "_count")}
        elif family.type == "counter":
            names.add(family.name + "_total")
        else:
            names.add(family.name)
    return names


def _seconds(value) -> float:
    if value is None:
        return 0.0
    return value.total_seconds() if isinstance(value, timedelta) else float(value) / 1e6


class YoloportalCollector(Collector):
    def __init__(self, redis_url: str | None = None, *, per_job: bool = True) -> None:
        self.redis_url = redis_url
        self.per_job = per_job  # the running jobs' series (job id, team, losses): token scrapes only

    def families(self) -> dict[str, Metric]:
        """Empty families, keyed by name (their samples are added by collect)."""
        f: dict[str, Metric] = {}

        def add(family: Metric) -> None:
            f[family.name] = family

        add(GaugeMetricFamily("yoloportal_jobs", "Jobs by state.", labels=["state"]))
        add(GaugeMetricFamily("yoloportal_queue_depth", "Queued jobs by team and priority class.",
                              labels=["team", "class"]))
        add(GaugeMetricFamily("yoloportal_jobs_running", "Running jobs by team.", labels=["team"]))
        add(GaugeMetricFamily("yoloportal_gpus_requested_queued",
                              "GPUs asked for by queued jobs, by priority class.", labels=["class"]))
        add(CounterMetricFamily("yoloportal_jobs_finished", "Jobs that reached a final state, by outcome.",
                                labels=["outcome"]))
        add(CounterMetricFamily("yoloportal_attempts_ended",
                                "Attempts that ended, by reason (failed, retry, preempted, node_lost, ...).",
                                labels=["reason"]))
        add(HistogramMetricFamily("yoloportal_job_wait_seconds",
                                  "Time from submit to the first start, by priority class.", labels=["class"]))
        add(HistogramMetricFamily("yoloportal_eta_absolute_error_seconds",
                                  "|actual first start - first ETA given|, by priority class.", labels=["class"]))
        add(GaugeMetricFamily("yoloportal_queue_wait_estimate_ratio_max",
                              "Largest (wait so far / first estimated wait) among queued jobs, by class.",
                              labels=["class"]))
        add(CounterMetricFamily("yoloportal_gpu_seconds_charged", "GPU-seconds charged to each team (ledger).",
                                labels=["team"]))
        add(GaugeMetricFamily("yoloportal_team_members", "Members of each team.", labels=["team"]))
        add(GaugeMetricFamily("yoloportal_user_quota_gpu_seconds_per_day",
                              "Per-member rolling 24 h GPU quota in force for each team (+Inf: no limit).",
                              labels=["team"]))
        add(GaugeMetricFamily("yoloportal_team_max_gpus", "GPUs a team may hold at once (+Inf: no limit; 0: none).",
                              labels=["team"]))
        add(GaugeMetricFamily("yoloportal_node_up", "1 if the node heartbeats and is not lost.", labels=["node"]))
        add(GaugeMetricFamily("yoloportal_node_info", "Node state and whether its GPUs are simulated.",
                              labels=["node", "state", "simulated"]))
        add(GaugeMetricFamily("yoloportal_node_gpus", "GPUs registered on the node.", labels=["node"]))
        add(GaugeMetricFamily("yoloportal_node_drained",
                              "1 while an operator's drain is in force (until Resume), whatever the node's state.",
                              labels=["node"]))
        add(GaugeMetricFamily("yoloportal_node_storage_problem",
                              "1 while the node's worker cannot reach the shared storage (no new work there).",
                              labels=["node"]))
        add(GaugeMetricFamily("yoloportal_gpu_utilization_ratio",
                              "GPU utilisation from the node's last heartbeat (pynvml; 0 when simulated).",
                              labels=["node", "gpu"]))
        add(GaugeMetricFamily("yoloportal_gpu_memory_used_bytes", "GPU memory in use (pynvml).",
                              labels=["node", "gpu"]))
        add(GaugeMetricFamily("yoloportal_gpu_memory_total_bytes", "GPU memory in total.", labels=["node", "gpu"]))
        add(GaugeMetricFamily("yoloportal_gpu_allocated_ratio",
                              "Share of the GPU allocated to starting/running jobs (0..1).", labels=["node", "gpu"]))
        add(GaugeMetricFamily("yoloportal_job_epoch", "Last finished epoch of each running job.",
                              labels=["job", "team"]))
        add(GaugeMetricFamily("yoloportal_job_loss", "Latest training loss of each running job.",
                              labels=["job", "team", "loss"]))
        add(GaugeMetricFamily("yoloportal_job_map", "Latest validation mAP of each running job.",
                              labels=["job", "team", "iou"]))
        add(GaugeMetricFamily("yoloportal_redis_up", "1 if this web process reached Redis during the scrape."))
        add(HistogramMetricFamily("yoloportal_scheduler_pass_duration_seconds",
                                  "Duration of a full scheduler pass (reap, repair, plan, start)."))
        add(GaugeMetricFamily("yoloportal_scheduler_last_pass_timestamp_seconds",
                              "Unix time the last scheduler pass finished."))
        add(HistogramMetricFamily("yoloportal_dispatch_latency_seconds",
                                  "Time from a GPU being freed while jobs waited to the next training process "
                                  "starting on it."))
        add(GaugeMetricFamily("yoloportal_websocket_clients", "Open job-page WebSockets across web processes."))
        add(GaugeMetricFamily("yoloportal_scrape_duration_seconds", "Time this scrape took to read its values."))
        return f

    def describe(self) -> Iterator[Metric]:
        return iter(())  # collected lazily: registering must not touch the database

    def collect(self) -> Iterator[Metric]:
        started = time.monotonic()
        f = self.families()
        now = timezone.now()
        self.collect_jobs(f, now)
        self.collect_ledger(f)
        self.collect_cluster(f, now)
        if self.per_job:
            self.collect_running(f)
        self.collect_redis(f)
        f["yoloportal_scrape_duration_seconds"].add_metric([], time.monotonic() - started)
        yield from f.values()

    # --- database ---------------------------------------------------------------------------

    def collect_jobs(self, f: dict[str, Metric], now) -> None:
        by_state = dict(Job.objects.order_by().values_list("state").annotate(n=Count("id")))
        for state in JobState.values:
            f["yoloportal_jobs"].add_metric([state], by_state.get(state, 0))
        for outcome in TERMINAL_STATES:
            f["yoloportal_jobs_finished"].add_metric([outcome], by_state.get(outcome, 0))

        queued = (Job.objects.filter(state=JobState.QUEUED).order_by()
                  .values_list("team__slug", "priority_class").annotate(n=Count("id"), g=Sum("gpus")))
        requested = dict.fromkeys(CLASSES, 0.0)
        for team, cls, n, gpus in queued:
            f["yoloportal_queue_depth"].add_metric([team, cls], n)
            requested[cls] = requested.get(cls, 0.0) + (gpus or 0.0)
        for cls, gpus in requested.items():
            f["yoloportal_gpus_requested_queued"].add_metric([cls], gpus)
        running = (Job.objects.filter(state=JobState.RUNNING).order_by().values_list("team__slug")
                   .annotate(n=Count("id")))
        for team, n in running:
            f["yoloportal_jobs_running"].add_metric([team], n)

        ended = dict(JobEvent.objects.filter(kind__in=ATTEMPT_END_REASONS).order_by().values_list("kind")
                     .annotate(n=Count("id")))
        for reason in ATTEMPT_END_REASONS:
            f["yoloportal_attempts_ended"].add_metric([reason], ended.get(reason, 0))

        wait = ExpressionWrapper(F("first_started_at") - F("created_at"), output_field=DurationField())
        self.histogram_by_class(f["yoloportal_job_wait_seconds"], Job.objects.filter(first_started_at__isnull=False),
                                wait, WAIT_BUCKETS_S)
        error = Case(
            When(first_started_at__gte=F("predicted_start_at"),
                 then=ExpressionWrapper(F("first_started_at") - F("predicted_start_at"), output_field=DurationField())),
            default=ExpressionWrapper(F("predicted_start_at") - F("first_started_at"), output_field=DurationField()),
            output_field=DurationField(),
        )
        self.histogram_by_class(f["yoloportal_eta_absolute_error_seconds"],
                                Job.objects.filter(first_started_at__isnull=False, predicted_start_at__isnull=False),
                                error, ETA_ERROR_BUCKETS_S)

        worst = dict.fromkeys(CLASSES, 0.0)
        for cls, created, predicted in (Job.objects.filter(state=JobState.QUEUED, predicted_start_at__isnull=False)
                                        .values_list("priority_class", "created_at", "predicted_start_at")):
            estimated = max((predicted - created).total_seconds(), ETA_RATIO_FLOOR_S)
            worst[cls] = max(worst.get(cls, 0.0), (now - created).total_seconds() / estimated)
        for cls, ratio in worst.items():
            f["yoloportal_queue_wait_estimate_ratio_max"].add_metric([cls], round(ratio, 3))

    @staticmethod
    def histogram_by_class(family: HistogramMetricFamily, jobs, duration, buckets) -> None:
        """Bucket counts computed by the database in one query (conditional counts)."""
        counts = {f"le{i}": Count("id", filter=Q(d__lte=timedelta(seconds=b))) for i, b in enumerate(buckets)}
        rows = {row["priority_class"]: row for row in
                jobs.annotate(d=duration).order_by().values("priority_class").annotate(n=Count("id"), s=Sum("d"),
                                                                                        **counts)}
        for cls in CLASSES:
            row = rows.get(cls, {})
            pairs = [(_le(b), row.get(f"le{i}", 0)) for i, b in enumerate(buckets)]
            pairs.append(("+Inf", row.get("n", 0)))
            family.add_metric([cls], pairs, _seconds(row.get("s")))

    def collect_ledger(self, f: dict[str, Metric]) -> None:
        charged = dict(UsageRecord.objects.order_by().values_list("team__slug").annotate(s=Sum("gpu_seconds")))
        members = dict(Membership.objects.order_by().values_list("team__slug").annotate(n=Count("id")))
        config = SchedulerConfig.current()
        quotas = {t.slug: getattr(t, "quota", None) for t in Team.objects.select_related("quota")}
        for team, quota in quotas.items():
            f["yoloportal_gpu_seconds_charged"].add_metric([team], charged.get(team, 0.0))
            f["yoloportal_team_members"].add_metric([team], members.get(team, 0))
            per_user = quota.user_gpu_hours_per_day if quota and quota.user_gpu_hours_per_day is not None \
                else config.user_gpu_hours_per_day
            # No limit is +Inf, not an absent series (operator trial 29: a deleted quota row took the
            # team's series away, which a rule reads as a team or a scrape gone). +Inf compares and
            # divides as "no limit" does: held >= max never holds, held / max is 0.
            f["yoloportal_user_quota_gpu_seconds_per_day"].add_metric(
                [team], per_user * 3600 if per_user is not None else math.inf)
            max_gpus = quota.max_gpus if quota and quota.max_gpus is not None else math.inf
            f["yoloportal_team_max_gpus"].add_metric([team], max_gpus)

    def collect_cluster(self, f: dict[str, Metric], now) -> None:
        allocated: dict[tuple[int, int], float] = {}
        for node_id, indices, share in (Job.objects.filter(state__in=HOLDING_STATES, node__isnull=False)
                                        .values_list("node_id", "gpu_indices", "gpu_share")):
            for index in indices or []:
                allocated[(node_id, index)] = allocated.get((node_id, index), 0.0) + share
        nodes = {n.pk: n for n in Node.objects.all()}
        gpu_count: dict[int, int] = {}
        for gpu in GPU.objects.order_by("node_id", "index"):
            node = nodes.get(gpu.node_id)
            if node is None:
                continue
            gpu_count[node.pk] = gpu_count.get(node.pk, 0) + 1
            labels = [node.name, str(gpu.index)]
            f["yoloportal_gpu_utilization_ratio"].add_metric(labels, gpu.utilization / 100)
            f["yoloportal_gpu_memory_used_bytes"].add_metric(labels, gpu.memory_used_mb * MIB)
            f["yoloportal_gpu_memory_total_bytes"].add_metric(labels, gpu.memory_mb * MIB)
            f["yoloportal_gpu_allocated_ratio"].add_metric(labels, min(1.0, allocated.get((node.pk, gpu.index), 0.0)))
        for node in nodes.values():
            up = node.state != Node.State.LOST and node.is_alive(now)
            f["yoloportal_node_up"].add_metric([node.name], 1 if up else 0)
            f["yoloportal_node_info"].add_metric([node.name, node.state, str(node.simulated).lower()], 1)
            f["yoloportal_node_gpus"].add_metric([node.name], gpu_count.get(node.pk, 0))
            # A drained node stopped for its maintenance is lost on purpose: the node-lost alert leaves
            # it alone (operator trial 20, F5). The reason stays until Resume, through the stop.
            f["yoloportal_node_drained"].add_metric([node.name], 1 if node.drain_reason else 0)
            f["yoloportal_node_storage_problem"].add_metric([node.name], 1 if node.storage_problem else 0)

    def collect_running(self, f: dict[str, Metric]) -> None:
        latest = MetricPoint.objects.filter(job=OuterRef("pk")).order_by("-epoch")
        running = (Job.objects.filter(state=JobState.RUNNING)
                   .annotate(last_epoch=Subquery(latest.values("epoch")[:1]),
                             last_values=Subquery(latest.values("values")[:1]))
                   .values_list("pk", "team__slug", "last_epoch", "last_values"))
        for pk, team, epoch, values in running:
            if epoch is None:
                continue
            if isinstance(values, str):  # a JSON subquery comes back as text on some backends
                import json
                values = json.loads(values)
            job = str(pk)
            f["yoloportal_job_epoch"].add_metric([job, team], epoch)
            for loss, key in LOSS_KEYS.items():
                if _finite(values.get(key)):
                    f["yoloportal_job_loss"].add_metric([job, team, loss], float(values[key]))
            for iou, keys in MAP_KEYS.items():
                value = next((values[k] for k in keys if _finite(values.get(k))), None)
                if value is not None:
                    f["yoloportal_job_map"].add_metric([job, team, iou], float(value))

    # --- Redis ------------------------------------------------------------------------------

    def collect_redis(self, f: dict[str, Metric]) -> None:
        client = redis.Redis.from_url(self.redis_url or settings.REDIS_URL, socket_timeout=1,
                                      socket_connect_timeout=1)
        try:
            client.ping()
            passes, passes_sum = recorders.SCHEDULER_PASS.read(client)
            latency, latency_sum = recorders.DISPATCH_LATENCY.read(client)
            last_pass = recorders.last_pass_time(client)
            sockets = recorders.websocket_clients(client)
        except redis.RedisError as exc:
            # Unreachable: one line per process and outage (apps/core/redis_outage.py), not one per scrape.
            if not redis_use_failed(exc):
                log.warning("/metrics: Redis unreachable (%s)", exc)
            f["yoloportal_redis_up"].add_metric([], 0)
            return
        finally:
            client.close()
        redis_reachable()
        f["yoloportal_redis_up"].add_metric([], 1)
        f["yoloportal_scheduler_pass_duration_seconds"].add_metric([], passes, passes_sum)
        f["yoloportal_dispatch_latency_seconds"].add_metric([], latency, latency_sum)
        if last_pass is not None:
            f["yoloportal_scheduler_last_pass_timestamp_seconds"].add_metric([], last_pass)
        f["yoloportal_websocket_clients"].add_metric([], sockets)


def _le(bound: float) -> str:
    return repr(float(bound))


def _finite(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def registry(*, per_job: bool = True) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(YoloportalCollector(per_job=per_job))
    return reg
