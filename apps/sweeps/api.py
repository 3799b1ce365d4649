"""REST: a sweep's trials table (``GET jobs/<id>/sweep/``). Submitting and cancelling a sweep are
the job endpoints' (``POST jobs/`` with a ``sweep:`` block, ``POST jobs/<id>/cancel/``)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.core.api import query_strict
from apps.core.openapi import ERROR
from apps.core.selectors import get_or_404
from apps.jobs.selectors import JOB_NOT_VISIBLE, job_list

from .selectors import sweep_view


class TrialOut(serializers.Serializer):
    number = serializers.IntegerField()
    job = serializers.UUIDField(allow_null=True)
    task_name = serializers.CharField()
    state = serializers.CharField(help_text="the trial job's state, 'pruned', or 'not submitted'")
    params = serializers.DictField()
    value = serializers.FloatField(allow_null=True, help_text="the metric of a succeeded trial")
    last = serializers.FloatField(allow_null=True, help_text="the metric at its latest epoch")
    epochs_done = serializers.IntegerField()
    epochs = serializers.IntegerField(allow_null=True)
    pruned = serializers.BooleanField()
    pruned_epoch = serializers.IntegerField(allow_null=True)
    note = serializers.CharField(help_text="why it was pruned, or could not be submitted")
    curve = serializers.ListField(child=serializers.DictField(), help_text="[{epoch, value}]")


class SweepOut(serializers.Serializer):
    id = serializers.UUIDField()
    task_name = serializers.CharField()
    state = serializers.CharField()
    method = serializers.CharField()
    metric = serializers.CharField()
    parameters = serializers.DictField()
    trials = serializers.IntegerField()
    parallel = serializers.IntegerField()
    prune = serializers.DictField(allow_null=True)
    seed = serializers.IntegerField()
    counts = serializers.DictField(child=serializers.IntegerField())
    best = serializers.DictField(allow_null=True)
    best_so_far = serializers.ListField(child=serializers.DictField())
    top_curves = serializers.ListField(child=serializers.IntegerField())
    rows = TrialOut(many=True)


class SweepDetail(APIView):
    @extend_schema(responses={200: SweepOut, 404: ERROR})
    def get(self, request, job_id):
        query_strict(request, takes=(), what="a sweep")
        job = get_or_404(job_list(user=request.user), job_id, JOB_NOT_VISIBLE)
        if not job.is_sweep:
            raise NotFound("This job is not a sweep.")
        return Response(sweep_view(job))
