"""REST endpoints for datasets: a scoped list, detail with its statistics, zip upload, delete, samples."""

from __future__ import annotations

import logging

from django.conf import settings
from django.http import FileResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import parsers, serializers, status
from rest_framework.exceptions import NotFound, PermissionDenied
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.accounts.selectors import is_manager_of, team_filter
from apps.accounts.throttles import RefundsRefusedUploads, UploadThrottle
from apps.accounts.uploads import STORE_REFUSALS, UploadRefused, storage_refusal, upload_input
from apps.core.api import StrictInput, choice_field, field_errors, query_strict
from apps.core.errors import FieldErrors
from apps.core.guards import InUse
from apps.core.openapi import ERROR, before_parameter, paginated
from apps.core.pagination import VERSION_ORDER, NewestFirstPage
from apps.core.selectors import get_or_404
from apps.core.storage import shared_filesystem

from .archive import ArchiveRejected
from .models import Dataset
from .selectors import SAMPLE_MAX_BYTES, dataset_list, dataset_sample_key, dataset_sample_path
from .services import NAME_RULE, dataset_delete, dataset_upload

log = logging.getLogger(__name__)

DATASET_NOT_VISIBLE = "No dataset with that id in your teams."


class DatasetOut(serializers.ModelSerializer):
    team = serializers.CharField(source="team.slug")
    reference = serializers.CharField(help_text="how a spec names exactly this version: data=<name>:v<version>")

    class Meta:
        model = Dataset
        fields = ["id", "team", "name", "version", "reference", "kind", "sha256", "size_bytes", "num_images",
                  "num_classes", "names", "description", "created_at"]


class DatasetDetailOut(DatasetOut):
    warnings = serializers.ListField(
        child=serializers.CharField(), source="label_warnings", read_only=True,
        help_text="stored, but: each split with images and no labelled object (a training validating on the "
                  "val split, and validating on such a split, are refused)")

    class Meta(DatasetOut.Meta):
        fields = [*DatasetOut.Meta.fields, "stats", "warnings"]


class DatasetUploadOut(DatasetDetailOut):
    skipped = serializers.ListField(
        child=serializers.CharField(), read_only=True,
        help_text="what the archive held that was not stored: documentation beside data.yaml (README.md, "
                  "LICENSE, *.pdf, a top-level *.txt) and OS clutter (.DS_Store, one line for __MACOSX/)")

    class Meta(DatasetDetailOut.Meta):
        fields = [*DatasetDetailOut.Meta.fields, "skipped"]


class DatasetIn(StrictInput):
    file = serializers.FileField(help_text="a .zip holding data.yaml, images/<split>/ and labels/<split>/ "
                                           "(kind=yolo), or images only (kind=images)")
    name = serializers.RegexField(r"^[a-z0-9][a-z0-9_-]{0,99}$", max_length=100,
                                  help_text="how specs refer to it: data=<name>; uploading a name again makes "
                                            "a new version",
                                  error_messages={"invalid": NAME_RULE})
    team = serializers.SlugField(required=False, help_text="team slug; optional when you are in one team")
    kind = choice_field(Dataset.Kind.choices, default=Dataset.Kind.YOLO, required=False)
    description = serializers.CharField(max_length=300, required=False, allow_blank=True, default="")


class UploadProblem(serializers.Serializer):
    path = serializers.CharField()
    problem = serializers.CharField()


class UploadReport(serializers.Serializer):
    file = serializers.ListField(child=serializers.CharField())
    problems = UploadProblem(many=True)
    problem_count = serializers.IntegerField()


class DatasetListCreate(RefundsRefusedUploads, APIView):
    parser_classes = [parsers.MultiPartParser]

    def get_throttles(self):
        return [UploadThrottle()] if self.request.method == "POST" else super().get_throttles()

    @extend_schema(parameters=[OpenApiParameter("team", str, description="a team you are in"),
                               OpenApiParameter("name", str), before_parameter("datasets")],
                   description="By team, name, newest version first. Follow `next` to page: it continues after "
                               "the last version shown (`before`); `count` is the list's length as it is now.",
                   responses={200: paginated(DatasetOut), 400: ERROR}, operation_id="datasets_list")
    def get(self, request):
        query_strict(request, takes=("team", "name", "before"), what="the dataset list", paged=True)
        try:
            team = team_filter(user=request.user, slug=request.query_params.get("team") or None)
        except FieldErrors as exc:
            return field_errors(exc.errors)
        paginator = NewestFirstPage(item="dataset", ordering=VERSION_ORDER)
        datasets = dataset_list(user=request.user, team=team.slug if team else None,
                                name=request.query_params.get("name") or None)
        page = paginator.paginate_queryset(datasets, request, view=self, cursor_scope=dataset_list(user=request.user),
                                           not_found="no dataset with that id in your teams")
        return paginator.get_paginated_response(DatasetOut(page, many=True).data)

    @extend_schema(request={"multipart/form-data": DatasetIn}, responses={
        201: DatasetUploadOut, 200: OpenApiResponse(
            DatasetUploadOut, description="the newest version already holds exactly these files: it, with "
                                          "\"unchanged\": true; no new version"), 413: ERROR, 429: ERROR, 503: ERROR, 400: OpenApiResponse(
            OpenApiTypes.OBJECT,
            description="field → problems; for a refused archive the body is an UploadReport: "
                        "{file: [summary], problems: [{path, problem}], problem_count}")})
    def post(self, request):
        try:
            values, team = upload_input(request, DatasetIn, settings.DATASET_UPLOAD_MAX_BYTES)
        except UploadRefused as exc:
            return exc.response
        upload = values["file"]
        try:
            dataset, created, skipped = dataset_upload(user=request.user, team=team, name=values["name"], upload=upload,
                                     size=upload.size, description=values.get("description", ""),
                                     kind=values.get("kind") or Dataset.Kind.YOLO)
        except ArchiveRejected as exc:
            return Response(exc.report(), status=status.HTTP_400_BAD_REQUEST)
        except STORE_REFUSALS as exc:
            return storage_refusal(exc, "the dataset was")
        finally:
            upload.close()
        body = {**DatasetDetailOut(dataset).data, "skipped": skipped}
        if not created:  # the newest version holds exactly these files: no new version
            return Response({**body, "unchanged": True}, status=status.HTTP_200_OK)
        return Response(body, status=status.HTTP_201_CREATED)


class DatasetDetail(APIView):
    @extend_schema(responses={200: DatasetDetailOut, 404: ERROR})
    def get(self, request, pk: int):
        query_strict(request, takes=(), what="a dataset")
        dataset = get_or_404(dataset_list(user=request.user), pk, DATASET_NOT_VISIBLE)
        return Response(DatasetDetailOut(dataset).data)

    @extend_schema(responses={204: None, 403: ERROR, 404: ERROR, 409: ERROR})
    def delete(self, request, pk: int):
        dataset = get_or_404(dataset_list(user=request.user), pk, DATASET_NOT_VISIBLE)
        if not is_manager_of(user=request.user, team=dataset.team):
            raise PermissionDenied("Only a manager of the team may delete a dataset version.")
        try:
            dataset_delete(dataset=dataset, by=request.user)
        except InUse as exc:  # an active job still reads it
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(status=status.HTTP_204_NO_CONTENT)


def _stored_sample(dataset: Dataset, index: int) -> FileResponse:
    from apps.core.api import StorageDown
    from apps.core.storage import StorageUnavailable, _unavailable, artifact_read

    found = dataset_sample_key(dataset, index)
    if found is None:
        raise NotFound("No sample with that number (or its file is gone).")
    key, content_type = found
    try:
        handle = artifact_read(key)
        size = handle.size
    except FileNotFoundError:
        raise NotFound("No sample with that number (or its file is gone).") from None
    except Exception as exc:
        if not isinstance(exc, StorageUnavailable) and not _unavailable(exc):
            raise
        log.warning("dataset sample %s: artifact storage unreachable: %s", key, exc)
        raise StorageDown("The artifact storage cannot be reached right now; try again in a minute.") from None
    if size > SAMPLE_MAX_BYTES:
        handle.close()
        raise NotFound("No sample with that number (or its file is gone).")
    return FileResponse(handle, content_type=content_type)


class DatasetSample(APIView):
    """One of the sample images the dataset page shows (their boxes are in ``stats.samples``)."""

    @extend_schema(responses={(200, "image/*"): OpenApiTypes.BINARY, 404: ERROR},
                   parameters=[OpenApiParameter("id", int, OpenApiParameter.PATH),
                               OpenApiParameter("index", int, OpenApiParameter.PATH)])
    def get(self, request, pk: int, index: int):
        query_strict(request, takes=(), what="a dataset's sample image")
        dataset = get_or_404(dataset_list(user=request.user), pk, DATASET_NOT_VISIBLE)
        if not shared_filesystem():  # read from the object store: this web machine may not have the files
            return _stored_sample(dataset, index)
        found = dataset_sample_path(dataset, index)
        if found is None:
            raise NotFound("No sample with that number (or its file is gone).")
        path, content_type = found
        return FileResponse(path.open("rb"), content_type=content_type)
