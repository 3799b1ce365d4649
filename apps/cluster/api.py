from __future__ import annotations

from rest_framework.response import Response
from rest_framework.views import APIView

from apps.jobs.selectors import queue_depth_by_class

from .selectors import cluster_overview, cluster_totals


class ClusterView(APIView):
    def get(self, request):
        nodes = cluster_overview(user=request.user)
        return Response({"totals": cluster_totals(nodes), "queue_depth": queue_depth_by_class(), "nodes": nodes})
