"""The API an attempt's relay reports to (Slurm nodes have no database or Redis credentials).

``POST /api/v1/attempts/<attempt_id>/report/`` with ``Authorization: Attempt <token>``:
the token is scoped to that one attempt and expires with it
(``jobs.services.attempt_token_issue``). No user session or API token is accepted here,
and the attempt token is accepted nowhere else.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.core.api import field_errors
from apps.core.openapi import ERROR

from .services import AttemptTokenError, attempt_report, attempt_token_check

MAX_EVENTS = 2000
MAX_LOG_CHARS = 1 << 20
STOP_HELP = ('"" to go on; "cancelled" or "fenced": stop the training now; "preempted": stop it after the current '
             "epoch's checkpoint and go on reporting (the attempt was preempted with a grace). A relay stops at once "
             "on a word it does not know.")


class AttemptReportIn(serializers.Serializer):
    events = serializers.ListField(child=serializers.DictField(), required=False, default=list,
                                   max_length=MAX_EVENTS)
    log = serializers.CharField(required=False, default="", allow_blank=True, trim_whitespace=False,
                                max_length=MAX_LOG_CHARS)
    final = serializers.DictField(required=False, allow_null=True, default=None)


class AttemptReport(APIView):
    authentication_classes: list = []  # the attempt's own token, checked below
    permission_classes = [AllowAny]

    @extend_schema(request=AttemptReportIn, responses={
        200: inline_serializer("AttemptReportOut", {"stop": serializers.CharField(help_text=STOP_HELP)}),
        400: ERROR, 403: ERROR})
    def post(self, request, attempt_id):
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme != "Attempt" or not token:
            return field_errors({"token": "send 'Authorization: Attempt <token>' (the attempt's own token)"}, 403)
        try:
            job = attempt_token_check(token.strip(), attempt_id=attempt_id)
        except AttemptTokenError as exc:
            return field_errors({"token": str(exc)}, 403)
        body = AttemptReportIn(data=request.data)
        if not body.is_valid():
            return Response(body.errors, status=400)
        data = body.validated_data
        stop = attempt_report(job, attempt_id=attempt_id, events=data["events"], log=data["log"],
                              final=data["final"])
        return Response({"stop": stop})
