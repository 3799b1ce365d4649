"""REST endpoints of the registry: versions (list, detail with lineage, stage), downloads that
re-check the stored sha256, weights uploads, exports, a prediction run's results."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import PurePosixPath
from typing import IO

from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import parsers, serializers, status
from rest_framework.exceptions import APIException, NotFound, PermissionDenied
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.accounts.selectors import is_manager_of, team_filter
from apps.accounts.throttles import RefundsRefusedUploads, UploadThrottle
from apps.accounts.uploads import STORE_REFUSALS, UploadRefused, storage_refusal, upload_input
from apps.core.api import StorageDown, StrictInput, choice_field, field_errors, query_choice, query_strict
from apps.core.artifacts import ArtifactKeyError, artifact_path
from apps.core.downloads import file_download
from apps.core.errors import FieldErrors
from apps.core.openapi import ERROR, RANGE_HEADER, RANGE_RESPONSES, before_parameter, paginated
from apps.core.pagination import VERSION_ORDER, NewestFirstPage
from apps.core.selectors import get_or_404
from apps.core.storage import ArtifactChanged, StorageUnavailable, artifact_local, artifact_read, shared_filesystem

from .models import Export, ModelVersion, Stage
from .selectors import export_list, model_list, prediction_list, predictions_missing_why
from .services import StageRefused, WeightsRefused, model_stage_set, weights_upload

log = logging.getLogger(__name__)
MODEL_NOT_VISIBLE = "No model with that id in your teams."


class StoredFileChanged(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "The stored file does not match its recorded sha256."
    default_code = "sha256_mismatch"


def verified_open(key: str, sha256: str, what: str) -> IO[bytes]:
    """Open an artifact for download after checking it still has its recorded sha256.

    The hash is computed over the very handle that is then streamed (rewound), so a file
    swapped by rename after the check is not what is sent. 404 when gone, 409 when changed.
    """
    if not shared_filesystem():
        return _stored_open(key, sha256, what)
    try:
        path = artifact_path(key)
    except ArtifactKeyError:
        raise NotFound(f"The {what} file is gone.") from None
    if not path.is_file():
        raise NotFound(f"The {what} file is gone.")
    handle = path.open("rb")
    digest = hashlib.sha256()
    while block := handle.read(1 << 20):
        digest.update(block)
    if sha256 and digest.hexdigest() != sha256:
        handle.close()
        log.error("artifact %s: sha256 %s on disk, %s recorded", key, digest.hexdigest(), sha256)
        raise StoredFileChanged(f"The {what} file changed on disk since it was stored (its sha256 no longer matches "
                                f"the recorded {sha256[:12]}…): it is not sent. An admin must restore it.")
    handle.seek(0)
    return handle


def _stored_open(key: str, sha256: str, what: str) -> IO[bytes]:
    """From an object store (apps/core/storage.py): with a recorded sha256 through this web
    node's hash-keyed cache, checked on the way in; without one, streamed as stored."""
    try:
        if sha256:
            return artifact_local(key, sha256).open("rb")
        return artifact_read(key)
    except (FileNotFoundError, ArtifactKeyError):
        raise NotFound(f"The {what} file is gone.") from None
    except ArtifactChanged as exc:
        log.error("artifact %s: %s", key, exc)
        raise StoredFileChanged(f"The {what} file changed in storage since it was stored (its sha256 no longer "
                                f"matches the recorded {sha256[:12]}…): it is not sent. An admin must restore it.") from None
    except StorageUnavailable as exc:
        log.warning("artifact %s: %s", key, exc)
        raise StorageDown(f"The artifact storage cannot be reached right now; the {what} file is safe there. "
                          "Try again in a minute.") from None


class ModelOut(serializers.ModelSerializer):
    team = serializers.CharField(source="team.slug")
    job = serializers.UUIDField(source="job_id", allow_null=True)
    reference = serializers.CharField()
    parent = serializers.SerializerMethodField()
    dataset = serializers.SerializerMethodField()

    class Meta:
        model = ModelVersion
        fields = ["id", "team", "name", "version", "reference", "source", "stage", "task", "filename", "job",
                  "sha256", "size", "metrics", "parent", "dataset", "created_at"]

    def get_parent(self, version) -> dict:
        return (version.lineage or {}).get("parent") or {}

    def get_dataset(self, version) -> dict:
        return (version.lineage or {}).get("dataset") or {}


class ExportOut(serializers.ModelSerializer):
    class Meta:
        model = Export
        fields = ["id", "format", "options", "sha256", "size", "verification", "job", "created_at"]


class ModelDetailOut(ModelOut):
    lineage = serializers.JSONField()
    exports = ExportOut(many=True)
    evaluations = serializers.SerializerMethodField()

    class Meta(ModelOut.Meta):
        fields = [*ModelOut.Meta.fields, "lineage", "stage_changed_at", "exports", "evaluations"]

    def get_evaluations(self, version) -> list[dict]:
        return [{"id": e.id, "job": str(e.job_id) if e.job_id else None, "split": e.split, "metrics": e.metrics,
                 "per_class": e.per_class, "dataset": e.dataset_lineage, "created_at": e.created_at.isoformat()}
                for e in version.evaluations.all()]


class ModelListView(APIView):
    @extend_schema(operation_id="models_list", responses={200: paginated(ModelOut), 400: ERROR}, parameters=[
        OpenApiParameter("team", str, description="a team you are in"), OpenApiParameter("name", str),
        OpenApiParameter("stage", str, enum=Stage.values), before_parameter("versions")],
        description="By team, name, newest version first. Follow `next` to page: it continues after the last "
                    "version shown (`before`); `count` is the list's length as it is now.")
    def get(self, request):
        """A page of versions, as every list: it was a bare array cut at 500 without a word, and
        refused ?limit= (CI trial 17, H3)."""
        # A stage or team it cannot filter by is a 400 naming it: ?stage=bogus was an empty list.
        query_strict(request, takes=("team", "name", "stage", "before"), what="the model list", paged=True)
        stage = query_choice(request, "stage", Stage.values)
        try:
            team = team_filter(user=request.user, slug=request.query_params.get("team") or None)
        except FieldErrors as exc:
            return field_errors(exc.errors)
        versions = model_list(user=request.user, team=team.slug if team else None,
                              name=request.query_params.get("name") or None)
        if stage:
            versions = versions.filter(stage=stage)
        paginator = NewestFirstPage(item="model version", ordering=VERSION_ORDER)
        page = paginator.paginate_queryset(versions, request, view=self, cursor_scope=model_list(user=request.user),
                                           not_found="no model version with that id in your teams")
        return paginator.get_paginated_response(ModelOut(page, many=True).data)


class ModelDetailView(APIView):
    @extend_schema(responses={200: ModelDetailOut, 404: ERROR})
    def get(self, request, pk: int):
        query_strict(request, takes=(), what="a model version")
        version = get_or_404(model_list(user=request.user).prefetch_related("exports", "evaluations"), pk,
                             MODEL_NOT_VISIBLE)
        return Response(ModelDetailOut(version).data)


# Weights and exports as what they are to a browser: bytes. Guessed from the name, a ".pt"
# file was served as "application/vnd.snesdev-page-table" (a new-user trial noticed).
BINARY = "application/octet-stream"


class ModelDownloadView(APIView):
    @extend_schema(responses={(200, "application/octet-stream"): OpenApiTypes.BINARY, **RANGE_RESPONSES, 404: ERROR,
                              409: ERROR},
                   parameters=[OpenApiParameter("id", int, OpenApiParameter.PATH), RANGE_HEADER,
                               OpenApiParameter("X-Weights-SHA256", str, OpenApiParameter.HEADER, response=[200],
                                                description="the file's sha256 (hex), checked against the file as "
                                                            "it was served; absent where none is recorded")])
    def get(self, request, pk: int):
        query_strict(request, takes=(), what="a model version's download")
        version = get_or_404(model_list(user=request.user), pk, MODEL_NOT_VISIBLE)
        handle = verified_open(version.weights_key, version.sha256, "weights")
        response = file_download(request, handle, as_attachment=True, filename=f"{version.name}-v{version.version}.pt",
                                 content_type=BINARY, sha256=version.sha256)
        if version.sha256:  # checked against the file just now: a script verifies its copy (yoloq model pull)
            response["X-Weights-SHA256"] = version.sha256  # as jobs/{id}/weights/ sends it
        return response


class ExportDownloadView(APIView):
    @extend_schema(responses={(200, "application/octet-stream"): OpenApiTypes.BINARY, **RANGE_RESPONSES, 404: ERROR,
                              409: ERROR},
                   parameters=[OpenApiParameter("id", int, OpenApiParameter.PATH), RANGE_HEADER,
                               OpenApiParameter("X-Export-SHA256", str, OpenApiParameter.HEADER, response=[200],
                                                description="the file's sha256 (hex), checked against the file as "
                                                            "it was served; absent where none is recorded")])
    def get(self, request, pk: int):
        query_strict(request, takes=(), what="an export's download")
        export = get_or_404(export_list(user=request.user), pk, "No export with that id in your teams.")
        handle = verified_open(export.key, export.sha256, f"{export.format} export")
        name = export.key.rsplit("/", 1)[-1]
        of = (f"{export.version.name}-v{export.version.version}" if export.version
              else PurePosixPath(export.model_lineage.get("name") or "weights").stem)  # weights that are no version
        response = file_download(request, handle, as_attachment=True, content_type=BINARY, filename=f"{of}-{name}",
                                 sha256=export.sha256)
        if export.sha256:  # checked against the file just now: a script verifies its copy (yoloq export pull)
            response["X-Export-SHA256"] = export.sha256
        return response


class StageIn(StrictInput):
    stage = choice_field(Stage.choices)


class StageOut(ModelDetailOut):
    also_changed = ModelOut(many=True, read_only=True,
                            help_text="other versions this move changed (the previous production one, archived)")

    class Meta(ModelDetailOut.Meta):
        fields = [*ModelDetailOut.Meta.fields, "also_changed"]


class ModelStageView(APIView):
    """Move a version to another stage (managers); answers the version as ``GET models/{id}/`` does,
    with ``also_changed`` (it was a list of every changed version: manager trial F16)."""

    @extend_schema(request=StageIn, responses={200: StageOut, 400: ERROR, 403: ERROR, 404: ERROR})
    def post(self, request, pk: int):
        version = get_or_404(model_list(user=request.user), pk, MODEL_NOT_VISIBLE)
        if not is_manager_of(user=request.user, team=version.team):
            raise PermissionDenied("Only a manager of the team may change a model's stage.")
        data = StageIn(data=request.data)
        data.is_valid(raise_exception=True)
        try:
            changed = model_stage_set(version=version, stage=data.validated_data["stage"], by=request.user)
        except StageRefused as exc:
            return field_errors({"stage": str(exc)})
        version = model_list(user=request.user).prefetch_related("exports", "evaluations").get(pk=version.pk)
        version.also_changed = [v for v in changed if v.pk != version.pk]
        return Response(StageOut(version).data)


class WeightsIn(StrictInput):
    file = serializers.FileField(help_text="a .pt checkpoint (Ultralytics training or model.save()); "
                                           "model=<file name> then names it in specs")
    team = serializers.SlugField(required=False, help_text="team slug; optional when you are in one team")
    name = serializers.CharField(required=False, help_text="the file name specs use (model=<name>), a plain "
                                                           "name ending in .pt; default: the uploaded file's name")


class WeightsUploadView(RefundsRefusedUploads, APIView):
    parser_classes = [parsers.MultiPartParser]
    throttle_classes = [UploadThrottle]

    @extend_schema(request={"multipart/form-data": WeightsIn}, responses={
        201: ModelOut, 200: OpenApiResponse(ModelOut, description="the newest upload of that name already holds "
                                                                  "these bytes: it, with \"unchanged\": true"),
        400: ERROR, 413: ERROR, 429: ERROR, 503: ERROR})
    def post(self, request):
        try:
            values, team = upload_input(request, WeightsIn, settings.WEIGHTS_UPLOAD_MAX_BYTES)
        except UploadRefused as exc:
            return exc.response
        upload = values["file"]
        # The multipart file name loses its folders on the way in ("../../x.pt" arrives as "x.pt"),
        # so a name with path parts is given, and refused, as the `name` field (trial 16, G10).
        named = "name" in values
        try:
            version, created = weights_upload(user=request.user, team=team, upload=upload,
                                              filename=values["name"] if named else upload.name, size=upload.size,
                                              filename_field="name" if named else "file")
        except WeightsRefused as exc:
            body = {exc.field: [str(exc)]}
            if exc.offending:
                body["offending_global"] = exc.offending
            return Response(body, status=status.HTTP_400_BAD_REQUEST)
        except STORE_REFUSALS as exc:
            return storage_refusal(exc, "the weights were")
        finally:
            upload.close()
        if not created:
            return Response({**ModelOut(version).data, "unchanged": True}, status=status.HTTP_200_OK)
        return Response(ModelOut(version).data, status=status.HTTP_201_CREATED)


class PredictionsView(APIView):
    """A predict job's results: per image its boxes, and where its annotated image is."""

    @extend_schema(responses={200: OpenApiTypes.OBJECT, 404: ERROR, 503: ERROR})
    def get(self, request, job_id):
        query_strict(request, takes=(), what="a predict job's results")
        run = prediction_run_or_404(request.user, job_id)
        results = _stored(prediction_results, run)
        for index, item in enumerate(results):
            item["url"] = f"/api/v1/jobs/{job_id}/predictions/{index}/image/"
        # The model it ran, as every other answer names a version: ``"version": 3`` was its
        # database id, which a user read as "v3" (trial 16, G3). None for weights of no version.
        model = {"id": run.version.pk, "reference": run.version.reference} if run.version else None
        return Response({"job": str(job_id), "model": model, "source": run.source, "images": run.images,
                         "boxes": run.boxes, "results": results})


class PredictionImageView(APIView):
    @extend_schema(responses={(200, "image/jpeg"): OpenApiTypes.BINARY, 404: ERROR, 503: ERROR})
    def get(self, request, job_id, index: int):
        query_strict(request, takes=(), what="an annotated image")
        run = prediction_run_or_404(request.user, job_id)
        results = _stored(prediction_results, run)
        if not 0 <= index < len(results):
            raise NotFound("No annotated image with that number.")
        if not shared_filesystem():  # streamed from the object store the predict job's node uploaded it to
            try:
                handle = _stored(artifact_read, f"{run.key}/{results[index]['image']}")
            except (ArtifactKeyError, FileNotFoundError, KeyError, TypeError):
                raise NotFound("The annotated image is gone.") from None
            return file_download(request, handle, content_type="image/jpeg")
        folder = artifact_path(run.key).resolve()
        path = (folder / results[index]["image"]).resolve()
        if not path.is_relative_to(folder) or not path.is_file():
            raise NotFound("The annotated image is gone.")
        return file_download(request, path.open("rb"), content_type="image/jpeg")


def prediction_run_or_404(user, job_id):
    run = prediction_list(user=user).filter(job_id=job_id).first()
    if run is None:
        raise NotFound(predictions_missing_why(user=user, job_id=job_id) or "No predictions for that job in your teams.")
    return run


def prediction_results(run) -> list[dict]:
    """The predict job's ``predictions.json`` ([] when gone); from the object store when there is
    one (StorageUnavailable while it cannot be reached)."""
    try:
        if not shared_filesystem():
            with artifact_read(f"{run.key}/predictions.json") as handle:
                return json.loads(handle.read())
        return json.loads((artifact_path(run.key) / "predictions.json").read_text())
    except (OSError, ValueError, ArtifactKeyError):
        return []


def _stored(read, *args):
    """``read(*args)``, a 503 saying why while the artifact store cannot be reached."""
    try:
        return read(*args)
    except StorageUnavailable as exc:
        log.warning("predictions: %s", exc)
        raise StorageDown("The artifact storage cannot be reached right now; try again in a minute.") from None
