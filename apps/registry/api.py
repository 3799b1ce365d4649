from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.http import FileResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.core.openapi import ERROR
from apps.core.selectors import get_or_404

from .models import ModelVersion
from .selectors import model_list

MODEL_NOT_VISIBLE = "No model with that id in your teams."


class ModelOut(serializers.ModelSerializer):
    team = serializers.CharField(source="team.slug")
    job = serializers.UUIDField(source="job_id")

    class Meta:
        model = ModelVersion
        fields = ["id", "team", "name", "version", "job", "sha256", "size", "metrics", "created_at"]


# Schema only: what ModelOut writes, with ``job`` nullable (a docstring here would show in the schema).
class ModelVersionOut(serializers.Serializer):
    id = serializers.IntegerField()
    team = serializers.CharField()
    name = serializers.CharField()
    version = serializers.IntegerField()
    job = serializers.UUIDField(allow_null=True)
    sha256 = serializers.CharField(allow_blank=True)
    size = serializers.IntegerField()
    metrics = serializers.DictField()
    created_at = serializers.DateTimeField()


class ModelListView(APIView):
    @extend_schema(operation_id="models_list", responses=ModelVersionOut(many=True))
    def get(self, request):
        return Response(ModelOut(model_list(user=request.user)[:500], many=True).data)


class ModelDetailView(APIView):
    @extend_schema(responses={200: ModelVersionOut, 404: ERROR})
    def get(self, request, pk: int):
        return Response(ModelOut(get_or_404(model_list(user=request.user), pk, MODEL_NOT_VISIBLE)).data)


class ModelDownloadView(APIView):
    @extend_schema(responses={(200, "application/octet-stream"): OpenApiTypes.BINARY, 404: ERROR},
                   parameters=[OpenApiParameter("pk", int, OpenApiParameter.PATH)])
    def get(self, request, pk: int):
        version = get_or_404(model_list(user=request.user), pk, MODEL_NOT_VISIBLE)
        path = Path(version.weights_path)
        if not path.is_file() or not path.resolve().is_relative_to(settings.JOBS_DIR.resolve()):
            raise NotFound("The weights file is gone.")
        return FileResponse(path.open("rb"), as_attachment=True,
                            filename=f"{version.name}-v{version.version}.pt")
