from __future__ import annotations

from django.conf import settings
from django.db import models


class Stage(models.TextChoices):
    NONE = "none"
    STAGING = "staging"
    PRODUCTION = "production"
    ARCHIVED = "archived"


def trained_class_names(lineage: dict | None, dataset) -> list[str] | None:
    """The classes weights trained here on ``dataset`` predict: its names by id, or the one
    ``item`` Ultralytics names every class with single_cls (``lineage["spec"]`` is the job's)."""
    train_args = ((lineage or {}).get("spec") or {}).get("train_args") or {}
    if train_args.get("single_cls"):
        return ["item"]
    return [str(name) for name in (dataset.names if dataset is not None else None) or []] or None


class ModelVersion(models.Model):
    """Weights in the registry, versioned per (team, name): trained by a job or uploaded.

    ``weights_key`` is an artifact key (apps/core/artifacts.py): a job's
    ``jobs/<id>/train/weights/best.pt`` or an upload's ``models/<team>/<name>/v<N>/<file>``.
    ``lineage`` keeps what the version came from, readable after its parents are deleted:
    ``parent`` (a registered version or uploaded/shared weights, with their sha256),
    ``dataset`` (team, name, version, sha256), ``spec``, ``code`` (python, torch,
    ultralytics versions). Version numbers come from apps.core.versions: never reused.
    """

    class Source(models.TextChoices):
        TRAINING = "training"
        UPLOAD = "upload"

    # PROTECT: a team with versions is not deleted (their weights and exports would stay in storage,
    # orphaned; accounts.services.team_delete_refusal names them). model_version_delete first.
    team = models.ForeignKey("accounts.Team", on_delete=models.PROTECT, related_name="model_versions")
    name = models.CharField(max_length=200)
    version = models.PositiveIntegerField()
    source = models.CharField(max_length=10, choices=Source.choices, default=Source.TRAINING)
    job = models.OneToOneField("jobs.Job", on_delete=models.SET_NULL, null=True, blank=True,
                               related_name="model_version")
    filename = models.CharField(max_length=200, blank=True, help_text="the uploaded file's name (yolov8s.pt)")
    weights_key = models.CharField(max_length=500)
    sha256 = models.CharField(max_length=64, blank=True)
    size = models.BigIntegerField(default=0)
    task = models.CharField(max_length=10, blank=True)
    metrics = models.JSONField(default=dict, blank=True)
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children")
    dataset = models.ForeignKey("datasets.Dataset", null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="model_versions")
    lineage = models.JSONField(default=dict, blank=True)
    stage = models.CharField(max_length=12, choices=Stage.choices, default=Stage.NONE)
    stage_changed_at = models.DateTimeField(null=True, blank=True)
    uploaded_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["team__slug", "name", "-version"]
        constraints = [models.UniqueConstraint(fields=["team", "name", "version"], name="unique_model_version")]

    def __str__(self) -> str:
        return f"{self.team.slug}/{self.name}:v{self.version}"

    @property
    def reference(self) -> str:
        """How a spec names exactly this version (``model=pcb:v3``)."""
        return f"{self.name}:v{self.version}"

    @property
    def class_names(self) -> list[str] | None:
        """The classes the weights predict, by id, where the registry knows them: a version trained
        here keeps the ones it was registered with (``lineage["class_names"]``: its dataset's, one
        ``item`` when trained with single_cls, as Ultralytics names it; :func:`trained_class_names`),
        so they outlive that dataset; uploaded weights the model's ``names`` the upload's checkpoint
        scan read (apps/registry/checkpoint_scan.py). None for uploads scanned before the names were
        read or whose names are not plain, and for a trained version registered before its names
        were kept whose dataset is gone and whose weights could not be read (migration 0005)."""
        if self.source == self.Source.UPLOAD:
            names = (((self.lineage or {}).get("uploaded") or {}).get("scan") or {}).get("class_names")
            return [str(name) for name in names] if isinstance(names, list) and names else None
        names = (self.lineage or {}).get("class_names")
        if isinstance(names, list) and names:
            return [str(name) for name in names]
        return trained_class_names(self.lineage, self.dataset) if self.dataset is not None else None

    def as_parent(self) -> dict:
        return {"kind": "version", "id": self.pk, "team": self.team.slug, "name": self.name,
                "version": self.version, "sha256": self.sha256}


class SharedWeights(models.Model):
    """Base weights every team may start from (``model=yolov8s.pt``), in ``weights/<file>``.

    Added by an admin (``manage.py weights add FILE --shared``) after the checkpoint check;
    a team's own uploaded weights of the same name win over these.
    """

    filename = models.CharField(max_length=200, unique=True)
    key = models.CharField(max_length=500)
    sha256 = models.CharField(max_length=64)
    size = models.BigIntegerField()
    task = models.CharField(max_length=10, blank=True)
    scan = models.JSONField(default=dict, blank=True)
    added_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                 related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["filename"]
        verbose_name_plural = "shared weights"

    def __str__(self) -> str:
        return self.filename


class Evaluation(models.Model):
    """A ``val`` job's result: metrics and the per-class table of one version on one dataset split.

    ``version`` is None for weights that are not a registered version (shared base weights, a
    file in the team's weights folder): ``model_lineage`` names them, the job's team sees it.
    """

    version = models.ForeignKey(ModelVersion, null=True, blank=True, on_delete=models.CASCADE,
                                related_name="evaluations")
    model_lineage = models.JSONField(default=dict, blank=True)  # the job's inputs.model: kind, name, sha256
    job = models.OneToOneField("jobs.Job", on_delete=models.SET_NULL, null=True, blank=True, related_name="evaluation")
    dataset = models.ForeignKey("datasets.Dataset", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    dataset_lineage = models.JSONField(default=dict, blank=True)
    split = models.CharField(max_length=10, default="val")
    metrics = models.JSONField(default=dict, blank=True)
    # [{"class": id, "name", "images", "instances", "precision", "recall", "map50", "map50_95"}]
    per_class = models.JSONField(default=list, blank=True)
    speed = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]


class Export(models.Model):
    """An exported file of a version (onnx, torchscript, engine), with how well it agrees with PyTorch.

    ``verification``: ``{"runtime", "images", "outputs", "max_abs", "max_rel", "atol", "rtol",
    "passed"}``: the exported file was run on validation images and its raw output
    tensors compared with the PyTorch model's on the same inputs (see the training
    child's docstring). An export beyond tolerance fails and is not stored.

    ``version`` is None for an export of weights that are not a registered version (shared base
    weights, a team file): the file stays in the job's folder, ``model_lineage`` names the weights.
    """

    version = models.ForeignKey(ModelVersion, null=True, blank=True, on_delete=models.CASCADE,
                                related_name="exports")
    model_lineage = models.JSONField(default=dict, blank=True)  # the job's inputs.model: kind, name, sha256
    job = models.ForeignKey("jobs.Job", on_delete=models.SET_NULL, null=True, blank=True, related_name="exports")
    format = models.CharField(max_length=20)
    options = models.JSONField(default=dict, blank=True)
    key = models.CharField(max_length=500)
    sha256 = models.CharField(max_length=64)
    size = models.BigIntegerField()
    verification = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]


class PredictionRun(models.Model):
    """A ``predict`` job's output: annotated images and boxes under the job's ``predict/`` folder."""

    job = models.OneToOneField("jobs.Job", on_delete=models.CASCADE, related_name="prediction_run")
    version = models.ForeignKey(ModelVersion, null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="prediction_runs")
    source = models.JSONField(default=dict, blank=True)
    # The folder holds the annotated images and predictions.json:
    # [{"image": "<file in the folder>", "source": "<source image, relative>", "boxes": [{class, name, conf, xyxy, polygon (segment), keypoints (pose)}],
    #   "top5" (a classifier's, no boxes): [{class, name, conf}]}]
    key = models.CharField(max_length=500, help_text="artifact key of the predict/ folder")
    images = models.PositiveIntegerField(default=0)
    boxes = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
