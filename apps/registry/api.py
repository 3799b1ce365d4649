from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.http import FileResponse
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.response import Response
from rest_framework.views import APIView

from .models import ModelVersion
from .selectors import model_get, model_list


class ModelOut(serializers.ModelSerializer):
    team = serializers.CharField(source="team.slug")
    job = serializers.UUIDField(source="job_id")

    class Meta:
        model = ModelVersion
        fields = ["id", "team", "name", "version", "job", "sha256", "size", "metrics", "created_at"]


class ModelListView(APIView):
    def get(self, request):
        return Response(ModelOut(model_list(user=request.user)[:500], many=True).data)


def visible_model(request, pk) -> ModelVersion:
    version = model_get(user=request.user, pk=pk)
    if version is None:
        raise NotFound("No model with that id in your teams.")
    return version


class ModelDetailView(APIView):
    def get(self, request, pk: int):
        return Response(ModelOut(visible_model(request, pk)).data)


class ModelDownloadView(APIView):
    def get(self, request, pk: int):
        version = visible_model(request, pk)
        path = Path(version.weights_path)
        if not path.is_file() or not path.resolve().is_relative_to(settings.JOBS_DIR.resolve()):
            raise NotFound("The weights file is gone.")
        return FileResponse(path.open("rb"), as_attachment=True,
                            filename=f"{version.name}-v{version.version}.pt")
