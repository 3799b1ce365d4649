"""REST endpoints for datasets: a scoped list, detail, and zip upload."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import parsers, serializers, status
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.accounts.selectors import team_list
from apps.accounts.throttles import UploadThrottle
from apps.core.api import StrictInput, field_errors
from apps.core.openapi import ERROR, paginated
from apps.core.selectors import get_or_404

from .archive import ArchiveRejected
from .models import Dataset
from .selectors import dataset_list
from .services import DatasetExists, dataset_upload


class DatasetOut(serializers.ModelSerializer):
    team = serializers.CharField(source="team.slug")

    class Meta:
        model = Dataset
        fields = ["id", "team", "name", "num_images", "num_classes", "description", "created_at"]


class DatasetIn(StrictInput):
    file = serializers.FileField(help_text="a .zip holding data.yaml, images/<split>/ and labels/<split>/")
    name = serializers.SlugField(max_length=100, help_text="how specs refer to it: data=<name>")
    team = serializers.SlugField(required=False, help_text="team slug; optional when you are in one team")
    description = serializers.CharField(max_length=300, required=False, allow_blank=True, default="")


class UploadProblem(serializers.Serializer):
    path = serializers.CharField()
    problem = serializers.CharField()


class UploadReport(serializers.Serializer):
    file = serializers.ListField(child=serializers.CharField())
    problems = UploadProblem(many=True)
    problem_count = serializers.IntegerField()


class DatasetListCreate(APIView):
    parser_classes = [parsers.MultiPartParser]

    def get_throttles(self):
        return [UploadThrottle()] if self.request.method == "POST" else super().get_throttles()

    @extend_schema(parameters=[OpenApiParameter("team", str)], responses=paginated(DatasetOut),
                   operation_id="datasets_list")
    def get(self, request):
        paginator = LimitOffsetPagination()
        datasets = dataset_list(user=request.user, team=request.query_params.get("team") or None)
        page = paginator.paginate_queryset(datasets, request, view=self)
        return paginator.get_paginated_response(DatasetOut(page, many=True).data)

    @extend_schema(request={"multipart/form-data": DatasetIn}, responses={201: DatasetOut, 409: ERROR, 413: ERROR, 429: ERROR, 400: OpenApiResponse(
                       OpenApiTypes.OBJECT,
                       description="field → problems; for a refused archive the body is an UploadReport: "
                                   "{file: [summary], problems: [{path, problem}], problem_count}")})
    def post(self, request):
        # Under ASGI, bodies past DATASET_UPLOAD_MAX_BYTES (+ multipart slack) never get here:
        # yoloportal/body_limit.py answers 413 before reading them. This check is for WSGI.
        declared = request.META.get("CONTENT_LENGTH") or "0"
        limit = settings.DATASET_UPLOAD_MAX_BYTES
        if declared.isdigit() and int(declared) > limit + 1024**2:
            return field_errors({"file": f"the upload is {int(declared)} bytes; the limit is {limit} bytes"})
        data = DatasetIn(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        teams = list(team_list(user=request.user))
        if values.get("team"):
            team = next((t for t in teams if t.slug == values["team"]), None)
            if team is None:
                return field_errors({"team": f"you are not a member of a team named {values['team']!r}"})
        elif len(teams) == 1:
            team = teams[0]
        else:
            return field_errors({"team": "is required: you are in several teams (or none)"})
        upload = values["file"]
        try:
            dataset = dataset_upload(user=request.user, team=team, name=values["name"], upload=upload,
                                     size=upload.size, description=values.get("description", ""))
        except ArchiveRejected as exc:
            return Response(exc.report(), status=status.HTTP_400_BAD_REQUEST)
        except DatasetExists as exc:
            return field_errors({"name": str(exc)}, status.HTTP_409_CONFLICT)
        finally:
            upload.close()
        return Response(DatasetOut(dataset).data, status=status.HTTP_201_CREATED)


class DatasetDetail(APIView):
    @extend_schema(responses={200: DatasetOut, 404: ERROR})
    def get(self, request, pk: int):
        dataset = get_or_404(dataset_list(user=request.user), pk, "No dataset with that id in your teams.")
        return Response(DatasetOut(dataset).data)
