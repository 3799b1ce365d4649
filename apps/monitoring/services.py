"""The cluster's hourly history (allocation, utilisation, queue), sampled by the scheduler."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import Count, F, Q, Sum
from django.utils import timezone

from apps.cluster.models import GPU, Node
from apps.jobs.models import HOLDING_STATES, Job, JobState

from .models import UtilisationHour


def cluster_snapshot(now: datetime) -> dict[str, float]:
    """GPUs on live nodes, the shares jobs hold, summed utilisation, running and queued jobs."""
    from django.conf import settings

    alive = Node.objects.exclude(state=Node.State.LOST).filter(
        last_heartbeat__gte=now - timedelta(seconds=settings.NODE_GRACE_S))
    gpus = GPU.objects.filter(node__in=alive).aggregate(n=Count("id"), u=Sum("utilization"))
    allocated = 0.0
    for indices, share in Job.objects.filter(state__in=HOLDING_STATES, node__in=alive).values_list(
            "gpu_indices", "gpu_share"):
        allocated += len(indices or []) * share
    counts = Job.objects.aggregate(running=Count("id", filter=Q(state=JobState.RUNNING)),
                                   queued=Count("id", filter=Q(state=JobState.QUEUED)))
    return {"gpu_sum": float(gpus["n"] or 0), "allocated_gpu_sum": min(allocated, float(gpus["n"] or 0)),
            "utilisation_sum": (gpus["u"] or 0) / 100, "running_jobs_sum": float(counts["running"]),
            "queued_jobs_sum": float(counts["queued"])}


def utilisation_sample(now: datetime | None = None) -> UtilisationHour:
    """Add one sample to the current hour's row (created on the hour's first sample)."""
    now = now or timezone.now()
    hour = now.replace(minute=0, second=0, microsecond=0)
    values = cluster_snapshot(now)
    increments = {name: F(name) + value for name, value in values.items()}
    if not UtilisationHour.objects.filter(hour=hour).update(samples=F("samples") + 1, **increments):
        try:
            with transaction.atomic():
                UtilisationHour.objects.create(hour=hour, samples=1, **values)
        except IntegrityError:  # a second scheduler created it meanwhile
            UtilisationHour.objects.filter(hour=hour).update(samples=F("samples") + 1, **increments)
    return UtilisationHour.objects.get(hour=hour)


def cluster_history(*, days: int = 30, now: datetime | None = None) -> dict:
    """Per day: mean allocation and utilisation (0..1), mean running and queued jobs. For admins."""
    from django.db.models.functions import TruncDate

    now = now or timezone.now()
    since = now - timedelta(days=days)
    rows = (UtilisationHour.objects.filter(hour__gte=since).annotate(day=TruncDate("hour")).values("day")
            .annotate(samples=Sum("samples"), gpus=Sum("gpu_sum"), allocated=Sum("allocated_gpu_sum"),
                      utilisation=Sum("utilisation_sum"), running=Sum("running_jobs_sum"),
                      queued=Sum("queued_jobs_sum")).order_by("day"))
    out = {"labels": [], "allocation": [], "utilisation": [], "running": [], "queued": []}
    for row in rows:
        out["labels"].append(row["day"].isoformat())
        out["allocation"].append(round(row["allocated"] / row["gpus"], 4) if row["gpus"] else 0.0)
        out["utilisation"].append(round(row["utilisation"] / row["gpus"], 4) if row["gpus"] else 0.0)
        out["running"].append(round(row["running"] / row["samples"], 2) if row["samples"] else 0.0)
        out["queued"].append(round(row["queued"] / row["samples"], 2) if row["samples"] else 0.0)
    return out
