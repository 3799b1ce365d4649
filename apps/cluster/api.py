from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.core.api import query_strict
from apps.core.openapi import ERROR
from apps.jobs.selectors import queue_depth_by_class
from apps.monitoring.recorders import scheduler_status

from .selectors import cluster_overview, cluster_totals


class ClusterTotalsOut(serializers.Serializer):
    gpus = serializers.IntegerField()
    gpus_available = serializers.IntegerField(help_text="GPUs of active nodes that report")
    gpus_allocated = serializers.FloatField()
    allocation = serializers.FloatField()
    nodes = serializers.IntegerField()
    nodes_alive = serializers.IntegerField()


# Schema only: the view returns the selectors' dicts (a docstring here would show in the schema).
class SchedulerOut(serializers.Serializer):
    planning = serializers.BooleanField(allow_null=True, help_text="a pass within the last minute; null: unknown")
    last_pass_at = serializers.DateTimeField(allow_null=True)
    seconds_since = serializers.IntegerField(allow_null=True)
    note = serializers.CharField(allow_blank=True, help_text="why queued jobs wait, when it is not planning")


class ClusterOut(serializers.Serializer):
    totals = ClusterTotalsOut()
    scheduler = SchedulerOut()
    queue_depth = serializers.DictField(child=serializers.IntegerField())
    nodes = serializers.ListField(child=serializers.DictField())


class ClusterView(APIView):
    @extend_schema(responses={200: ClusterOut, 400: ERROR})
    def get(self, request):
        query_strict(request, takes=(), what="the cluster view")
        nodes = cluster_overview(user=request.user)
        return Response({"totals": cluster_totals(nodes), "scheduler": scheduler_status(),
                         "queue_depth": queue_depth_by_class(), "nodes": nodes})
