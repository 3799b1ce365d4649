from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from apps.cluster.selectors import cluster_overview, cluster_totals
from apps.jobs.selectors import active_jobs_of, queue_depth_by_class


@login_required
def dashboard(request):
    nodes = cluster_overview(user=request.user)
    return render(request, "portal/dashboard.html", {
        "nodes": nodes,
        "totals": cluster_totals(nodes),
        "queue_depth": queue_depth_by_class(),
        "my_jobs": active_jobs_of(user=request.user)[:50],
    })
