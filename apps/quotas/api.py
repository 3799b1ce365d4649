from __future__ import annotations

import csv
import io

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, PolymorphicProxySerializer, extend_schema
from rest_framework import serializers
from rest_framework.renderers import BaseRenderer
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from apps.accounts.selectors import team_filter
from apps.core.api import field_errors, query_strict
from apps.core.errors import FieldErrors
from apps.core.openapi import ERROR

from .reports import GROUPS, columns, period_parse, usage_report
from .selectors import usage_summary


class UsageCsvRenderer(BaseRenderer):
    """``?format=csv``: the report's rows, one per team or per (team, user), columns as in reports.columns()."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        out = io.StringIO()
        if isinstance(data, dict) and "rows" in data:
            rest = columns(data["group"])[1:]
            writer = csv.DictWriter(out, fieldnames=[data["group"], *rest], lineterminator="\n")
            writer.writeheader()
            for row in data["rows"]:
                writer.writerow({data["group"]: row["key"], **{c: row[c] for c in rest}})
        else:  # an error body or the summary: still CSV, key,value
            writer = csv.writer(out, lineterminator="\n")
            for key, value in (data or {}).items():
                writer.writerow([key, value])
        return out.getvalue().encode()


# Schema only: the view returns usage_summary's dict (a docstring here would show in the schema).
class UsageOut(serializers.Serializer):
    user = serializers.CharField()
    me = serializers.DictField()
    teams = serializers.DictField(child=serializers.DictField())


class UsageReportOut(serializers.Serializer):
    from_ = serializers.DateTimeField()
    to = serializers.DateTimeField()
    group = serializers.ChoiceField(choices=GROUPS)
    team = serializers.CharField(required=False, help_text="present when the report was asked for one team")
    rows = serializers.ListField(child=serializers.DictField(), help_text=(
        f"columns per team: {', '.join(columns('team'))}; per user (one row per team and user, the usage charged "
        f"to that team): {', '.join(columns('user'))}"))

    def get_fields(self):
        fields = super().get_fields()
        fields["from"] = fields.pop("from_")
        return fields


# Without group/from/to/team (or format=csv) the summary; with them the report.
USAGE_OUT = PolymorphicProxySerializer(component_name="UsageOrReport", serializers=[UsageOut, UsageReportOut],
                                       resource_type_field_name=None)


class UsageView(APIView):
    renderer_classes = [*api_settings.DEFAULT_RENDERER_CLASSES, UsageCsvRenderer]

    @extend_schema(responses={200: USAGE_OUT, 400: ERROR}, parameters=[
        OpenApiParameter("group", str, enum=list(GROUPS), description="report per team or per user"),
        OpenApiParameter("from", str, description="ISO date or date-time (default: 7 days before 'to')"),
        OpenApiParameter("to", str, description="ISO date (inclusive) or date-time (default: now)"),
        OpenApiParameter("team", str, description="only what was charged to this team (one of yours)"),
        OpenApiParameter("format", str, enum=["json", "csv"]),
    ])
    def get(self, request):
        query_strict(request, takes=("group", "from", "to", "team"), what="usage")
        params = request.query_params
        wants_report = any(name in params for name in ("group", "from", "to", "team")) or params.get("format") == "csv"
        if not wants_report:
            return Response(usage_summary(user=request.user))
        group = params.get("group", "team")
        if group not in GROUPS:
            return field_errors({"group": f"must be one of {', '.join(GROUPS)}"})
        try:
            start, end = period_parse(params.get("from"), params.get("to"), now=timezone.now())
        except FieldErrors as exc:
            return field_errors(exc.errors)
        try:
            team = team_filter(user=request.user, slug=params.get("team") or None)
        except FieldErrors as exc:
            return field_errors(exc.errors)
        rows = [row.flat() for row in usage_report(user=request.user, start=start, end=end, group=group, team=team)]
        data = {"from": start.isoformat(), "to": end.isoformat(), "group": group,
                **({"team": team.slug} if team else {}), "rows": rows}
        response = Response(data)
        if params.get("format") == "csv":
            response["Content-Disposition"] = (
                f'attachment; filename="usage-{group}-{start:%Y%m%d}-{end:%Y%m%d}.csv"')
        return response
