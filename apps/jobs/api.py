"""REST endpoints for jobs: thin views over services and selectors."""

from __future__ import annotations

import copy
import json
import re
import threading

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ObjectDoesNotExist
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
    inline_serializer,
)
from rest_framework import parsers, serializers, status
from rest_framework.exceptions import NotFound, ParseError
from rest_framework.fields import Field, SkipField
from rest_framework.relations import PKOnlyObject
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.accounts.selectors import member_filter, team_filter, team_list
from apps.accounts.throttles import SubmitThrottle
from apps.core.api import StrictInput, field_errors, query_strict, surrogates_refuse
from apps.core.downloads import file_download
from apps.core.errors import FieldErrors
from apps.core.openapi import ERROR, RANGE_HEADER, RANGE_RESPONSES, paginated
from apps.core.pagination import ListPage, NewestFirstPage
from apps.core.selectors import get_or_404
from apps.core.storage import StorageUnavailable
from apps.core.strict_yaml import YamlError, load_yaml, text_decode
from apps.core.values import ascii_int

from .continuation import ContinueRefused, job_continue
from .models import STATE_FILTERS, Job, JobEvent, JobState, LogChunk, MetricPoint
from .selectors import (
    JOB_NOT_VISIBLE,
    job_list,
    job_may_cancel,
    job_may_requeue,
    job_weights_find,
    queue_list,
    sweep_best_trial,
)
from .services import (
    DuplicateJob,
    IdempotencyKeyReused,
    JobClassRefused,
    TooManyActiveJobs,
    job_cancel,
    job_class_change,
    job_requeue,
    job_submit,
    spec_parse,
)
from .spec import SpecError, parse_gpus, parse_memory_mb


class ParsedYAML(dict):
    """What the YAML parsers hand the view: the text as sent (``__raw__``, kept as the job's spec) and
    what it loaded (``__doc__``). A type of its own: a JSON body ``{"__doc__": 1}`` is a dict with the
    same key, and was taken for this (a KeyError, a 500)."""


class YAMLParser(parsers.BaseParser):
    media_type = "application/yaml"

    def parse(self, stream, media_type=None, parser_context=None):
        raw = stream.read(settings.SPEC_MAX_BYTES + 1)
        if len(raw) > settings.SPEC_MAX_BYTES:
            raise ParseError({"spec": f"is larger than the limit of {settings.SPEC_MAX_BYTES} bytes"})
        try:
            text = text_decode(raw, utf16=True)
            return ParsedYAML(__raw__=text, __doc__=load_yaml(text, max_bytes=settings.SPEC_MAX_BYTES,
                                                                sent_bytes=len(raw)))
        except YamlError as exc:
            raise ParseError(exc.errors) from None


class TextYAMLParser(YAMLParser):
    media_type = "text/yaml"


class XYAMLParser(YAMLParser):
    media_type = "application/x-yaml"


class DuplicateJsonKey(ValueError):
    pass


def _one_of_each_key(pairs: list) -> dict:
    """``json.loads``' object hook: a key given twice in one object is refused (json keeps the
    last without a word; the strict YAML loader refuses it too)."""
    document = {}
    for key, value in pairs:
        if key in document:
            raise DuplicateJsonKey(f"names the key {key!r} twice in one object")
        document[key] = value
    return document


class BoundedJSONParser(parsers.JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        raw = stream.read(settings.SPEC_MAX_BYTES + 1)
        if len(raw) > settings.SPEC_MAX_BYTES:
            raise ParseError({"spec": f"is larger than the limit of {settings.SPEC_MAX_BYTES} bytes"})
        try:
            document = json.loads(raw.decode("utf-8"), object_pairs_hook=_one_of_each_key)
        except DuplicateJsonKey as exc:
            raise ParseError({"spec": str(exc)}) from None
        except (UnicodeDecodeError, ValueError) as exc:
            raise ParseError({"spec": f"is not valid JSON: {exc}"}) from None
        except RecursionError:
            raise ParseError({"spec": "is nested too deeply"}) from None
        surrogates_refuse(document, "spec")
        return document


def query_int(request, name: str, default: int = 0) -> int:
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return default
    try:
        value = ascii_int(raw)
    except ValueError:
        raise ParseError({name: f"must be an integer, got {raw!r}"}) from None
    if value < 0:
        raise ParseError({name: "must be 0 or more"})
    return value


_readers = threading.local()  # ModelFieldsOnce subclass -> an unbound instance, per thread


class ModelFieldsOnce(serializers.ModelSerializer):
    """An output-only ModelSerializer that maps the model's fields once per class, not once per instance.

    DRF rebuilds every field from the model's metadata each time a serializer is created;
    for the job (35 fields, on every submit and every row of a list) that was the biggest
    single cost of the response. Each instance binds its own shallow copy of the class's
    first mapping: binding sets a field's name and parent on the copy, and reading leaves the
    rest alone. (DRF deep-copies declared fields, which re-runs every field's constructor:
    a tenth of a submit's CPU. Inputs keep DRF's way: validation may mutate a field.)
    """

    def get_fields(self):
        cls = type(self)
        if "_mapped_fields" not in cls.__dict__:
            cls._mapped_fields = super().get_fields()
        return {name: copy.copy(field) for name, field in cls._mapped_fields.items()}

    def _plan(self) -> list:
        return [(field.field_name, field, field.source_attrs if type(field).get_attribute is Field.get_attribute
                 else None)
                for field in self._readable_fields]

    def to_representation(self, instance):
        """DRF's loop (Serializer.to_representation), without most of its cost per value.

        DRF reads each value through Field.get_attribute, which tests every attribute on
        the way for being a callable to call, and catches and re-raises to explain errors:
        for a list page of 100 jobs that was more CPU than the query. A field that does not
        override get_attribute is read here with plain getattr along its source; anything
        unusual (a callable, a missing attribute, a mapping) goes DRF's own way, as do the
        relation fields (their pk-only reading saves a query) and SkipField."""
        if (self.parent is None and not self._context and "fields" not in self.__dict__
                and "_read_plan" not in self.__dict__):
            # A lone serializer (the 201 of a submit, one job's page): its fields would be
            # copied and bound for this one call. A reader of this class kept by the thread
            # has them bound already; without context or parent the output is the same.
            reader = _readers.__dict__.get(type(self))
            if reader is None:
                reader = _readers.__dict__[type(self)] = type(self)()
                reader._read_plan = reader._plan()
            return reader.to_representation(instance)
        plan = self.__dict__.get("_read_plan")
        if plan is None:
            plan = self._read_plan = self._plan()
        out = {}
        for name, field, attrs in plan:
            value = instance
            if attrs is not None:
                try:
                    for attr in attrs:
                        value = getattr(value, attr)
                except (AttributeError, ObjectDoesNotExist):
                    attrs = None
                else:
                    if callable(value):
                        attrs = None
            if attrs is None:
                try:
                    value = field.get_attribute(instance)
                except SkipField:
                    continue
            if (value.pk if isinstance(value, PKOnlyObject) else value) is None:
                out[name] = None
            else:
                out[name] = field.to_representation(value)
        return out


class JobOut(ModelFieldsOnce):
    team = serializers.CharField(source="team.slug")
    user = serializers.CharField(source="user.username")
    node = serializers.SerializerMethodField()
    gpus = serializers.JSONField(source="gpu_indices")
    resources = serializers.SerializerMethodField()
    epochs = serializers.SerializerMethodField()
    simulated = serializers.SerializerMethodField()
    cancel_requested = serializers.SerializerMethodField()
    # The row's id, not its number: a script building name:v{model_version} got the wrong version (CI trial 17, H11).
    model_version = serializers.SerializerMethodField(
        help_text="the id of the model version registered from this job (GET models/{id}/), not its version number; "
                  "a sweep's: its best trial's")
    # Team-relative only: the resolved absolute paths stay server-side (apps.jobs.paths).
    spec = serializers.JSONField(source="public_spec", read_only=True)
    error = serializers.CharField(source="public_error", read_only=True)
    priority = serializers.FloatField(source="priority_score", required=False)  # the planner's score

    class Meta:
        model = Job
        fields = [
            "id", "task_name", "state", "team", "user", "priority_class", "resources", "attempt",
            "created_at", "first_started_at", "started_at", "finished_at", "queue_position",
            "estimated_start_at", "estimated_start_low_at", "estimated_start_high_at", "predicted_start_at",
            "run_class",
            "reason", "node", "gpus", "gpu_share", "simulated", "error", "exit_code", "priority",
            "priority_factors", "timeout_s", "retries_left", "epochs", "epochs_done",
            "cancel_requested", "model_version", "spec", "is_sweep", "parent",
        ]

    def get_node(self, job: Job) -> str | None:
        return job.node.name if job.node_id else None

    def get_simulated(self, job: Job) -> bool | None:
        return job.node.simulated if job.node_id else None

    def get_resources(self, job: Job) -> dict:
        return {"gpu": job.gpus, "gpu_memory_mb": job.gpu_memory_mb, "cpu_milli": job.cpu_milli,
                "memory_mb": job.memory_mb, "gpu_model": job.spec.get("gpu_models", [])}

    def get_epochs(self, job: Job) -> int | None:
        return (job.spec.get("train_args") or {}).get("epochs")

    def get_cancel_requested(self, job: Job) -> bool:
        return job.cancel_requested_at is not None

    def get_model_version(self, job: Job) -> int | None:
        if job.is_sweep:  # the version registered from its best trial (it was null: CI trial 17, H5)
            best = sweep_best_trial(job)
            version = getattr(best, "model_version", None) if best is not None else None
        else:
            version = getattr(job, "model_version", None)
        return version.pk if version else None


class JobWeightsOut(serializers.Serializer):
    available = serializers.BooleanField()
    url = serializers.CharField(allow_null=True, help_text="jobs/{id}/weights/ where there are weights")
    epoch = serializers.IntegerField(allow_null=True, help_text="the epoch of an ended job's checkpoint")
    note = serializers.CharField(help_text="which weights they are, or why there are none")
    sha256 = serializers.CharField(allow_blank=True,
                                   help_text="the served file's sha256 (also X-Weights-SHA256); '' where none is recorded")


class JobOutcomeOut(serializers.Serializer):
    mode = serializers.CharField()
    evaluation = serializers.DictField(allow_null=True, required=False,
                                       help_text="a val job's: id, version, dataset, split, metrics, classes, url")
    predictions = serializers.DictField(allow_null=True, required=False,
                                        help_text="a predict job's: images, boxes, classified (a classify model's: "
                                                  "each image's top-5 classes, no boxes), url (jobs/{id}/predictions/)")
    exports = serializers.ListField(child=serializers.DictField(), required=False,
                                    help_text="each exported file: id, format, size, passed, download")


class JobDetailOut(JobOut):
    """One job (``GET jobs/{id}/``): the list's fields, plus what it has to download and what it produced."""

    weights = serializers.SerializerMethodField()
    outcome = serializers.SerializerMethodField()

    class Meta(JobOut.Meta):
        fields = [*JobOut.Meta.fields, "weights", "outcome"]

    @extend_schema_field(JobOutcomeOut(allow_null=True))
    def get_outcome(self, job: Job) -> dict | None:
        """What a succeeded val, predict or export job (or a training's ``export:``) stored; null until then."""
        if job.state != JobState.SUCCEEDED or job.is_sweep:
            return None
        mode = (job.spec or {}).get("mode") or "train"
        outcome: dict = {"mode": mode}
        evaluation = getattr(job, "evaluation", None) if mode == "val" else None
        if evaluation is not None:
            data = evaluation.dataset_lineage or {}
            outcome["evaluation"] = {
                "id": evaluation.pk, "version": evaluation.version_id, "split": evaluation.split,
                "dataset": f"{data['name']}:v{data['version']}" if data.get("name") else None,
                "metrics": evaluation.metrics, "classes": len(evaluation.per_class or []),
                "url": f"models/{evaluation.version_id}/" if evaluation.version_id else None}
        run = getattr(job, "prediction_run", None) if mode == "predict" else None
        if run is not None:
            # A classifier's predictions are each image's top-5 classes, no boxes: "0 boxes" said nothing.
            task = ((job.spec or {}).get("resolved") or {}).get("task") or (run.version.task if run.version else "")
            outcome["predictions"] = {"images": run.images, "boxes": run.boxes, "classified": task == "classify",
                                      "url": f"jobs/{job.pk}/predictions/"}
        exports = list(job.exports.order_by("created_at")) if mode == "export" or job.spec.get("export") else []
        if exports:
            outcome["exports"] = [{"id": e.pk, "format": e.format, "size": e.size,
                                   "passed": (e.verification or {}).get("passed"),
                                   "download": f"exports/{e.pk}/download/"} for e in exports]
        return outcome

    @extend_schema_field(JobWeightsOut)
    def get_weights(self, job: Job) -> dict:
        found = job_weights_find(job)
        return {"available": bool(found.key), "url": f"jobs/{job.pk}/weights/" if found.key else None,
                "epoch": found.epoch, "note": found.note or found.missing, "sha256": found.sha256 if found.key else ""}


class JobSpecDoc(serializers.Serializer):
    """The job spec as JSON (documentation only: apps.jobs.spec.parse_spec validates it). Every one of
    the spec's own fields (apps.jobs.spec.TOP_LEVEL_KEYS) is here: val, predict, export, preemptible and
    expected_duration were missing, so a client generated from the schema could not send them (trial 32)."""

    task_name = serializers.CharField(max_length=200)
    command = serializers.CharField(required=False, help_text="yolo [task] train key=value …")
    train = serializers.DictField(required=False, help_text="training arguments, instead of command")
    val = serializers.DictField(required=False, help_text="validation arguments (yolo val), instead of command")
    predict = serializers.DictField(required=False, help_text="prediction arguments (yolo predict), instead of command")
    export = serializers.JSONField(required=False, help_text=(
        "a training's formats to export after it ends, e.g. [onnx] (onnx, torchscript); with no command or train, "
        "the export arguments (yolo export), e.g. {model: pcb:v1, format: onnx}"))
    preemptible = serializers.BooleanField(required=False, help_text=(
        "false: never preempted, charged 1.25x in fair-share usage (docs/scheduling.md); default true"))
    expected_duration = serializers.IntegerField(required=False, min_value=1, help_text=(
        "your runtime estimate in seconds, used for start estimates until the scheduler has history"))
    task = serializers.ChoiceField(choices=["detect", "segment", "classify", "pose", "obb"], required=False)
    resources = serializers.DictField(required=False, help_text="{gpu: 1, memory: 16Gi, cpu: '4'}")
    priority = serializers.ChoiceField(choices=["low", "medium", "high", "urgent"], required=False)
    user = serializers.CharField(required=False, help_text="team slug to charge (or your username)")
    team = serializers.CharField(required=False)
    timeout = serializers.IntegerField(required=False)
    retries = serializers.IntegerField(required=False)
    allow_duplicate = serializers.BooleanField(required=False)
    image = serializers.CharField(required=False)
    description = serializers.CharField(required=False)
    sweep = serializers.DictField(required=False, help_text=(
        "a hyperparameter sweep of this training spec: {method: grid|random|tpe, parameters: {lr0: {low, high, "
        "log}, batch: [8, 16]}, trials, parallel, metric, prune: median|asha} (docs/sweeps.md)"))


# ``?mine=``: anything else is refused, not read as false.
TRUE, FALSE = {"1", "true", "yes"}, {"0", "false", "no"}


def list_filters(request) -> dict:
    """``?team=``, ``?user=`` and ``?mine=`` of a job list, checked: a bad value raises FieldErrors
    naming the parameter (never an empty page that reads as "no jobs")."""
    raw_mine = request.query_params.get("mine", "").lower()
    if raw_mine not in {"", *TRUE, *FALSE}:
        raise FieldErrors({"mine": f"must be true or false, got {raw_mine!r}"})
    team = team_filter(user=request.user, slug=request.query_params.get("team") or None)
    username = request.query_params.get("user") or None
    try:
        owner = member_filter(user=request.user, username=username)
    except FieldErrors:
        # Someone who left the caller's teams (manage.py team remove-member leaves their running jobs
        # to finish) is still the owner of jobs there the caller sees: `yoloq queue --user eve` answered
        # "no member of your teams is named 'eve'" while eve's job ran in the operator's team (optrial24).
        owner = (get_user_model().objects.filter(username=username, jobs__team__in=team_list(user=request.user))
                 .first())
        if owner is None:
            raise
    return {"team": team.slug if team else None, "mine": raw_mine in TRUE, "owner": owner}


FILTER_NAMES = ("team", "user", "mine")
ID_PREFIX = re.compile(r"[0-9a-fA-F-]{4,36}")
LIST_FILTERS = [
    OpenApiParameter("team", str, description="a team you are in"),
    OpenApiParameter("user", str, description="a member of your teams, or someone who has jobs in them (user name)"),
    OpenApiParameter("mine", bool),
]


# How long a submit refused at the active-job cap is told to wait (Retry-After). A place frees when
# one of the user's jobs ends, which no one can time; a client that retries on 429 (urllib3's Retry,
# CI wrappers) read a 429 without Retry-After as "at once" and hammered, or gave up (trial 32).
ACTIVE_CAP_RETRY_S = 60


def active_cap_refusal(cap: TooManyActiveJobs) -> Response:
    """The 429 of a submit (or continue) past MAX_ACTIVE_JOBS_PER_USER: the count, the limit, and
    when to ask again, as the throttles' 429s say it (``Retry-After`` in seconds)."""
    detail = f"{cap}. Try again in {ACTIVE_CAP_RETRY_S} seconds at the earliest"
    return Response({"detail": detail, "active_jobs": cap.count, "limit": cap.limit},
                    status=status.HTTP_429_TOO_MANY_REQUESTS, headers={"Retry-After": str(ACTIVE_CAP_RETRY_S)})


class JobListCreate(APIView):
    parser_classes = [BoundedJSONParser, YAMLParser, TextYAMLParser, XYAMLParser]

    def get_throttles(self):
        return [SubmitThrottle()] if self.request.method == "POST" else super().get_throttles()

    @extend_schema(
        parameters=[
            OpenApiParameter("state", str, enum=list(STATE_FILTERS),
                             description="a job state, or active (queued, starting, running) or finished (any ended state)"),
            OpenApiParameter("id", str, description="jobs whose id starts with this (at least 4 characters, as "
                                                    "`yoloq queue` prints ids)"),
            OpenApiParameter("before", str, description="the jobs listed after this one (a job id): what a `next` "
                                                        "link carries, so that jobs submitted, or leaving a "
                                                        "filter, between two pages neither repeat nor hide any; "
                                                        "not with offset"),
            *LIST_FILTERS,
        ],
        responses={200: paginated(JobOut), 400: ERROR},
        operation_id="jobs_list",
        description="Newest first. Follow `next` to page: it continues after the last job shown (`before`); "
                    "`count` is the list's length as it is now.",
    )
    def get(self, request):
        query_strict(request, takes=("state", "id", "before", *FILTER_NAMES), what="the job list", paged=True)
        state = request.query_params.get("state") or None
        if state and state not in STATE_FILTERS:
            return field_errors({"state": f"must be one of {', '.join(STATE_FILTERS)}, got {state[:50]!r}"})
        prefix = request.query_params.get("id")
        if prefix is not None and not ID_PREFIX.fullmatch(prefix):
            # 'zzzz' was told "must be at least 4 characters" (new-user trial 23): say what a prefix is made of.
            return field_errors({"id": f"must be the start of a job id: 4 to 36 hex digits (0-9, a-f) and dashes, "
                                       f"got {prefix[:50]!r}"})
        try:
            filters = list_filters(request)
        except FieldErrors as exc:
            return field_errors(exc.errors)
        jobs = job_list(user=request.user, state=state, **filters)
        if prefix:
            # UUIDField's startswith compares without dashes on every database (Django's UUIDTextMixin).
            jobs = jobs.filter(id__startswith=prefix.lower())
        paginator = NewestFirstPage()
        page = paginator.paginate_queryset(jobs.select_related("model_version"), request, view=self,
                                           cursor_scope=job_list(user=request.user),
                                           not_found="no job with that id in your teams")
        return paginator.get_paginated_response(JobOut(page, many=True).data)

    @extend_schema(
        request={"application/json": JobSpecDoc, "application/yaml": OpenApiTypes.STR},
        responses={201: JobOut, 200: JobOut, 400: ERROR, 409: ERROR, 429: ERROR},
        parameters=[OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER)],
    )
    def post(self, request):
        if isinstance(request.data, ParsedYAML):
            raw, document = request.data["__raw__"], request.data["__doc__"]
        else:
            document = request.data
            raw = json.dumps(document, indent=2, default=str)
        key = request.headers.get("Idempotency-Key", "")
        if len(key) > 200:
            return field_errors({"Idempotency-Key": "must be at most 200 characters"})
        try:
            spec = spec_parse(document, user=request.user)
            job, created = job_submit(user=request.user, spec=spec, raw_spec=raw, idempotency_key=key)
        except SpecError as exc:
            return field_errors(exc.errors)
        except IdempotencyKeyReused as reused:  # named as the caller sent it: the header
            return field_errors({"Idempotency-Key": reused.errors["idempotency_key"]}, status.HTTP_409_CONFLICT)
        except TooManyActiveJobs as cap:
            return active_cap_refusal(cap)
        except DuplicateJob as dup:
            return Response(
                {"detail": f"an identical job of your team is already active: {dup.job.task_name} ({str(dup.job.pk)[:8]}, "
                           f"{dup.job.state}) runs the same command (task, mode, arguments, export settings, sweep), "
                           f"GPUs (count, memory, models) and image; its name, class, timeout and host memory do not "
                           f"count. Set allow_duplicate: true to run it again",
                 "job": JobOut(dup.job).data},
                status=status.HTTP_409_CONFLICT,
            )
        if created:
            # A job created a moment ago has no model version: say so rather than ask the database.
            job._state.fields_cache["model_version"] = None
        return Response(JobOut(job).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


class JobDetail(APIView):
    @extend_schema(responses={200: JobDetailOut, 404: ERROR})
    def get(self, request, job_id):
        query_strict(request, takes=(), what="a job")
        return Response(JobDetailOut(get_or_404(job_list(user=request.user), job_id, JOB_NOT_VISIBLE)).data)


class NoInput(StrictInput):
    """The body of an action that takes none: a field sent is named in a 400, not dropped (CI trial 17, H8)."""


class JobCancelIn(StrictInput):
    # Refused as PLATFORM_FIELDS' "reason" (the queue's: "is computed by the scheduler") before: a
    # manager's script could not say why, which the owner's notification promises (trial 32).
    reason = serializers.CharField(required=False, allow_blank=True, max_length=200,
                                   help_text="why (optional): in the job's timeline and, when the job is "
                                             "someone else's, in its owner's notification")


class JobCancel(APIView):
    @extend_schema(request=JobCancelIn, responses={202: JobOut, 400: ERROR, 403: ERROR, 404: ERROR, 409: ERROR})
    def post(self, request, job_id):
        job = get_or_404(job_list(user=request.user), job_id, JOB_NOT_VISIBLE)
        data = JobCancelIn(data=request.data)
        data.is_valid(raise_exception=True)
        if not job_may_cancel(user=request.user, job=job):
            return Response({"detail": "only the job's owner or a team manager may cancel it"},
                            status=status.HTTP_403_FORBIDDEN)
        if job.state not in (JobState.QUEUED, JobState.STARTING, JobState.RUNNING):
            return field_errors({"state": f"job is already {job.state}; nothing to cancel"}, status.HTTP_409_CONFLICT)
        job_cancel(job=job, by=request.user, reason=data.validated_data.get("reason", "").strip())
        job.refresh_from_db()
        return Response(JobOut(job).data, status=status.HTTP_202_ACCEPTED)


class JobRequeue(APIView):
    """Managers: put a starting/running job back in the queue as a new attempt (resumes from its checkpoint)."""

    @extend_schema(request=None, responses={202: JobOut, 400: ERROR, 403: ERROR, 404: ERROR, 409: ERROR})
    def post(self, request, job_id):
        job = get_or_404(job_list(user=request.user), job_id, JOB_NOT_VISIBLE)
        NoInput(data=request.data).is_valid(raise_exception=True)
        if not job_may_requeue(user=request.user, job=job):
            return Response({"detail": "only a manager of the job's team may requeue it"},
                            status=status.HTTP_403_FORBIDDEN)
        if job.is_sweep:
            return field_errors({"state": "a sweep runs no attempt of its own; requeue one of its trials"},
                                status.HTTP_409_CONFLICT)
        if job.state not in (JobState.STARTING, JobState.RUNNING):
            return field_errors({"state": f"job is {job.state}; only starting or running jobs can be requeued"},
                                status.HTTP_409_CONFLICT)
        if not job_requeue(job, reason=f"requeued by {request.user.username}", kind="requeued", by=request.user):
            return field_errors({"state": "job changed state meanwhile; try again"}, status.HTTP_409_CONFLICT)
        job.refresh_from_db()
        return Response(JobOut(job).data, status=status.HTTP_202_ACCEPTED)


class JobContinueIn(StrictInput):
    # PLATFORM_FIELDS says "ask with resources.gpu", a spec's field: here the field is gpu (trial 32).
    forbidden = {"gpus": 'are allocated by the scheduler (ask with gpu, e.g. {"gpu": 1})'}

    timeout = serializers.IntegerField(required=False, min_value=1,
                                       help_text="seconds; the new job's timeout (default: the job's own)")
    # Blank and untrimmed reach the spec's own parser: `yoloq continue ID --memory ""` got DRF's "may
    # not be blank", where a spec's resources.memory says what a quantity looks like (trial28).
    memory = serializers.CharField(required=False, max_length=32, allow_blank=True, trim_whitespace=False,
                                   help_text="the new job's resources.memory, e.g. 16Gi (default: the job's own); "
                                             "for a job that ran out of memory")

    # Any JSON value reaches the spec's own parser, so 0.3, "two" or true get resources.gpu's words.
    gpu = serializers.JSONField(required=False,
                                help_text="the new job's resources.gpu: a whole number of GPUs or 0.125, 0.25 or "
                                          "0.5 of one (default: the job's own); fewer for a job over a per-job "
                                          "GPU limit lowered since it was submitted")

    val = serializers.BooleanField(required=False,
                                   help_text="the new job's val argument (default: the job's own); false to "
                                             "continue a training whose dataset's val split has no labels")

    def validate_memory(self, value: str) -> str:
        try:
            parse_memory_mb(value)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None
        return value

    def validate_gpu(self, value) -> float:
        try:
            return parse_gpus(value)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None


class JobContinue(APIView):
    """A new job with the same spec whose first attempt resumes this ended job's newest stored
    checkpoint (apps/jobs/continuation.py): it trains only the epochs left. Submit's checks apply."""

    throttle_classes = [SubmitThrottle]

    @extend_schema(request=JobContinueIn,
                   responses={201: JobOut, 200: JobOut, 400: ERROR, 404: ERROR, 409: ERROR, 429: ERROR, 503: ERROR},
                   parameters=[OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER)])
    def post(self, request, job_id):
        job = get_or_404(job_list(user=request.user), job_id, JOB_NOT_VISIBLE)
        data = JobContinueIn(data=request.data)
        data.is_valid(raise_exception=True)
        key = request.headers.get("Idempotency-Key", "")
        if len(key) > 200:
            return field_errors({"Idempotency-Key": "must be at most 200 characters"})
        try:
            new, created = job_continue(job=job, user=request.user, timeout_s=data.validated_data.get("timeout"),
                                        memory=data.validated_data.get("memory"), gpus=data.validated_data.get("gpu"),
                                        val=data.validated_data.get("val"), idempotency_key=key)
        except ContinueRefused as refused:
            return field_errors(refused.errors, refused.status)
        except StorageUnavailable as exc:
            return Response({"detail": f"the artifact storage cannot be reached, try again: {exc}"},
                            status=status.HTTP_503_SERVICE_UNAVAILABLE)
        except SpecError as exc:
            return field_errors(exc.errors)
        except IdempotencyKeyReused as reused:
            return field_errors({"Idempotency-Key": reused.errors["idempotency_key"]}, status.HTTP_409_CONFLICT)
        except TooManyActiveJobs as cap:
            return active_cap_refusal(cap)
        except DuplicateJob as dup:
            return Response({"detail": f"an identical job of your team is already active: {dup.job.task_name} "
                                       f"({str(dup.job.pk)[:8]}, {dup.job.state}); continued or submitted again "
                                       f"already?", "job": JobOut(dup.job).data},
                            status=status.HTTP_409_CONFLICT)
        if created:
            new._state.fields_cache["model_version"] = None
        return Response(JobOut(new).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


class JobClassIn(StrictInput):
    priority = serializers.CharField(help_text="low | medium | high | urgent")


class JobClass(APIView):
    """Managers: move a queued job to another priority class (the admin's "Set class", the job page's);
    a sweep's class is its queued trials' and the later ones'."""

    @extend_schema(request=JobClassIn, responses={
        200: JobOut, 403: ERROR, 404: ERROR,
        400: OpenApiResponse(OpenApiTypes.OBJECT, description="a priority that is no class, named `priority`"),
        409: OpenApiResponse(OpenApiTypes.OBJECT, description="the job is not queued (a sweep: has ended), named "
                                                              "`state`, as cancel/ and requeue/ answer a job in the "
                                                              "wrong state")})
    def post(self, request, job_id):
        job = get_or_404(job_list(user=request.user), job_id, JOB_NOT_VISIBLE)
        data = JobClassIn(data=request.data)
        data.is_valid(raise_exception=True)
        try:
            job_class_change(job, priority_class=data.validated_data["priority"], by=request.user)
        except JobClassRefused as refused:
            if refused.field is None:
                return Response({"detail": refused.message}, status=status.HTTP_403_FORBIDDEN)
            if refused.field == "state":
                # A 409 naming `state`, as cancel/ and requeue/ answer a job in the wrong state: it was a
                # 400 naming `priority`, so a client retrying on 409-state treated it apart (CI trial 17, H12).
                return field_errors({"state": refused.message}, status.HTTP_409_CONFLICT)
            return field_errors({"priority": refused.message})
        job.refresh_from_db()
        return Response(JobOut(job).data)


class MetricOut(serializers.ModelSerializer):
    class Meta:
        model = MetricPoint
        fields = ["seq", "epoch", "attempt", "values", "created_at"]


class LogOut(serializers.ModelSerializer):
    class Meta:
        model = LogChunk
        fields = ["seq", "attempt", "text", "created_at"]


class EventOut(serializers.ModelSerializer):
    class Meta:
        model = JobEvent
        fields = ["seq", "attempt", "kind", "message", "data", "created_at"]

    def to_representation(self, event: JobEvent) -> dict:
        # Stored clean since job_event() scrubs; rows written before that are scrubbed here.
        data = super().to_representation(event)
        data["message"] = event.public_message()
        data["data"] = event.public_data()
        return data


class _SeqList(APIView):
    model = None
    out = None
    what = ""  # what the list holds, for its errors
    limit = 1000

    def get(self, request, job_id):
        query_strict(request, takes=("after",), what=f"the job's {self.what}")
        job = get_or_404(job_list(user=request.user), job_id, JOB_NOT_VISIBLE)
        after = query_int(request, "after")
        rows = self.model.objects.filter(job=job, seq__gt=after).order_by("seq")[: self.limit]
        return Response({"job": str(job.pk), "state": job.state, "seq": job.seq,
                         "results": self.out(rows, many=True).data})


def seq_page(name: str, out) -> serializers.Serializer:
    return inline_serializer(name, fields={
        "job": serializers.UUIDField(), "state": serializers.CharField(), "seq": serializers.IntegerField(),
        "results": out(many=True)})


@extend_schema(parameters=[OpenApiParameter("after", int)],
               responses={200: seq_page("JobMetricsPage", MetricOut), 400: ERROR, 404: ERROR})
class JobMetrics(_SeqList):
    model, out, what = MetricPoint, MetricOut, "metrics"


@extend_schema(parameters=[OpenApiParameter("after", int)],
               responses={200: inline_serializer("JobLogsPage", fields={
                   "job": serializers.UUIDField(), "state": serializers.CharField(), "seq": serializers.IntegerField(),
                   "results": LogOut(many=True),
                   "note": serializers.CharField(required=False, help_text=(
                       "only on a first page (no after) with no chunks, when LOG_RETENTION_DAYS deleted the "
                       "ended job's logs: says so"))}),
                          400: ERROR, 404: ERROR, 503: ERROR})
class JobLogs(_SeqList):
    model, out, what = LogChunk, LogOut, "logs"
    limit = 500

    def get(self, request, job_id):
        # Hot logs from the database, cold ones from their archive (apps/jobs/log_archive.py).
        from .log_archive import log_chunks, logs_gone_note

        query_strict(request, takes=("after",), what="the job's logs")
        job = get_or_404(job_list(user=request.user), job_id, JOB_NOT_VISIBLE)
        after = query_int(request, "after")
        try:
            rows = log_chunks(job, after=after, limit=self.limit)
        except StorageUnavailable:
            return Response({"detail": "This job's logs are archived in the artifact storage, which cannot be "
                                       "reached right now. Try again in a minute."},
                            status=status.HTTP_503_SERVICE_UNAVAILABLE)
        body = {"job": str(job.pk), "state": job.state, "seq": job.seq, "results": self.out(rows, many=True).data}
        if not rows and not after and (note := logs_gone_note(job)):
            body["note"] = note  # retention deleted them: say so rather than an empty page (optrial24)
        return Response(body)


@extend_schema(parameters=[OpenApiParameter("after", int)],
               responses={200: seq_page("JobEventsPage", EventOut), 400: ERROR, 404: ERROR})
class JobEvents(_SeqList):
    model, out, what = JobEvent, EventOut, "events"


class JobWeights(APIView):
    """Download the job's trained weights: a succeeded job's best.pt, an ended one's newest stored best.pt or
    last.pt checkpoint (``X-Weights-Epoch`` says of which epoch; ``jobs.selectors.job_weights_find``), with
    ``X-Weights-SHA256`` where its hash is recorded."""

    @extend_schema(responses={(200, "application/octet-stream"): OpenApiTypes.BINARY, **RANGE_RESPONSES, 404: ERROR},
                   parameters=[RANGE_HEADER,
        OpenApiParameter("X-Weights-SHA256", str, OpenApiParameter.HEADER, response=[200],
                         description="the file's sha256 (hex), checked against the file as it was served; "
                                     "absent where none is recorded"),
        OpenApiParameter("X-Weights-Epoch", int, OpenApiParameter.HEADER, response=[200],
                         description="the epoch of a checkpoint (an ended job's best.pt or last.pt); absent for "
                                     "a succeeded job's final weights"),
        OpenApiParameter("X-Weights-Note", str, OpenApiParameter.HEADER, response=[200],
                         description="which weights these are, in words")])
    def get(self, request, job_id):
        query_strict(request, takes=(), what="a job's weights")
        job = get_or_404(job_list(user=request.user), job_id, JOB_NOT_VISIBLE)
        found = job_weights_find(job)
        if not found.key:
            raise NotFound(found.missing)
        from pathlib import Path

        from apps.core.artifacts import artifact_key
        from apps.registry.api import verified_open

        key = found.key
        if key.startswith("/"):  # stored before rows held artifact keys
            path = Path(key)
            if not path.resolve().is_relative_to(settings.JOBS_DIR.resolve()):
                raise NotFound("The weights file is gone.")
            key = artifact_key(path)
        if not key.startswith(f"jobs/{found.folder_of or job.pk}/"):
            raise NotFound("The weights file is gone.")
        handle = verified_open(key, found.sha256, "weights")
        suffix = f"-epoch{found.epoch}" if found.epoch is not None else ""
        response = file_download(request, handle, as_attachment=True, sha256=found.sha256,
                                 filename=f"{job.task_name}-{job.id}{suffix}.pt",
                                 content_type="application/octet-stream")  # not the name's guess (registry.api.BINARY)
        # Which weights these are (a cancelled job's are a checkpoint of some epoch): yoloq prints them.
        response["X-Weights-Note"] = found.note
        if found.epoch is not None:
            response["X-Weights-Epoch"] = str(found.epoch)
        if found.sha256:  # checked against the file just now (verified_open): a script verifies its copy
            response["X-Weights-SHA256"] = found.sha256
        return response


class QueueEntryOut(serializers.Serializer):
    position = serializers.IntegerField(allow_null=True)
    id = serializers.UUIDField()
    task_name = serializers.CharField()
    team = serializers.CharField()
    user = serializers.CharField()
    priority_class = serializers.CharField()
    priority = serializers.FloatField()
    priority_factors = serializers.DictField()
    resources = serializers.DictField()
    estimated_start_at = serializers.DateTimeField(allow_null=True)
    # The range the start is expected in (~80 % of starts fall in it); null where there is no estimate.
    estimated_start_low_at = serializers.DateTimeField(allow_null=True)
    estimated_start_high_at = serializers.DateTimeField(allow_null=True)
    reason = serializers.CharField(allow_blank=True)
    created_at = serializers.DateTimeField()


class QueueList(APIView):
    """Queued jobs of the caller's teams in scheduler order, a page at a time (``limit`` ≤ 1000)."""

    @extend_schema(parameters=[*LIST_FILTERS, OpenApiParameter("limit", int), OpenApiParameter("offset", int)],
                   responses={200: paginated(QueueEntryOut), 400: ERROR})
    def get(self, request):
        query_strict(request, takes=FILTER_NAMES, what="the queue", paged=True)
        try:
            filters = list_filters(request)
        except FieldErrors as exc:
            return field_errors(exc.errors)
        paginator = ListPage()
        jobs = paginator.paginate_queryset(queue_list(user=request.user, **filters), request, view=self)
        return paginator.get_paginated_response([
            {"position": j.queue_position, "id": str(j.pk), "task_name": j.task_name, "team": j.team.slug,
             "user": j.user.username, "priority_class": j.priority_class, "priority": j.priority_score,
             "priority_factors": j.priority_factors, "resources": JobOut().get_resources(j),
             "estimated_start_at": j.estimated_start_at, "estimated_start_low_at": j.estimated_start_low_at,
             "estimated_start_high_at": j.estimated_start_high_at, "reason": j.reason, "created_at": j.created_at}
            for j in jobs
        ])
