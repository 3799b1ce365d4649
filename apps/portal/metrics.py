"""Prometheus text at /metrics: counts only, nothing team-specific."""

from __future__ import annotations

from django.db.models import Count
from django.http import HttpResponse
from django.utils import timezone

from apps.cluster.models import GPU, Node
from apps.jobs.models import Job, JobState


def prometheus_metrics(request) -> HttpResponse:
    lines = ["# HELP yoloportal_jobs Jobs by state.", "# TYPE yoloportal_jobs gauge"]
    counts = dict(Job.objects.values_list("state").annotate(n=Count("id")))
    for state in JobState.values:
        lines.append(f'yoloportal_jobs{{state="{state}"}} {counts.get(state, 0)}')
    now = timezone.now()
    nodes = list(Node.objects.all())
    lines += [
        "# HELP yoloportal_nodes Registered nodes by liveness.", "# TYPE yoloportal_nodes gauge",
        f'yoloportal_nodes{{alive="true"}} {sum(1 for n in nodes if n.is_alive(now))}',
        f'yoloportal_nodes{{alive="false"}} {sum(1 for n in nodes if not n.is_alive(now))}',
        "# HELP yoloportal_gpus Registered GPUs.", "# TYPE yoloportal_gpus gauge",
        f"yoloportal_gpus {GPU.objects.count()}",
    ]
    pairs = list(Job.objects.filter(first_started_at__isnull=False, predicted_start_at__isnull=False)
                 .order_by("-first_started_at").values_list("predicted_start_at", "first_started_at")[:100])
    if pairs:
        error = sum(abs((actual - predicted).total_seconds()) for predicted, actual in pairs) / len(pairs)
        lines += [
            "# HELP yoloportal_eta_abs_error_seconds Mean |first ETA given - actual start| of the last 100 started jobs.",
            "# TYPE yoloportal_eta_abs_error_seconds gauge",
            f"yoloportal_eta_abs_error_seconds {error:.1f}",
        ]
    return HttpResponse("\n".join(lines) + "\n", content_type="text/plain; version=0.0.4")
