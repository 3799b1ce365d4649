from __future__ import annotations

from django.conf import settings
from django.db import models

from .stats import classification_task_problem, label_task_problem


class Dataset(models.Model):
    """One version of a team's dataset: (team, name, version), its files under ``key``.

    Uploading a name again makes a new version; old versions stay usable (``data=pcb:v1``)
    until deleted, and version numbers are never issued twice (apps.core.versions). Jobs
    record the version and its ``sha256`` (the hash of the file manifest, see
    ``apps.datasets.stats.manifest_sha256``). Files live under the artifact ``key``
    (``datasets/<team>/<name>/v<N>``), never at an absolute path stored here.
    """

    class Kind(models.TextChoices):
        YOLO = "yolo", "YOLO dataset (images and labels)"
        IMAGES = "images", "images to predict on"
        CLASSIFY = "classify", "classification dataset (a folder of images per class)"

    # PROTECT: a team with versions is not deleted (their folders would stay in storage, orphaned;
    # accounts.services.team_delete_refusal names them). Deleted through dataset_delete first.
    team = models.ForeignKey("accounts.Team", on_delete=models.PROTECT, related_name="datasets")
    name = models.SlugField(max_length=100)
    version = models.PositiveIntegerField(default=1)
    kind = models.CharField(max_length=10, choices=Kind.choices, default=Kind.YOLO)
    key = models.CharField(max_length=500, help_text="artifact key of the dataset's folder")
    yaml_key = models.CharField(max_length=500, blank=True, help_text="artifact key of data.yaml ('' for images)")
    sha256 = models.CharField(max_length=64, blank=True, help_text="hash of the file manifest")
    size_bytes = models.BigIntegerField(default=0)
    num_images = models.PositiveIntegerField(default=0)
    num_classes = models.PositiveIntegerField(default=0)
    names = models.JSONField(default=list, blank=True, help_text="class names by id")
    # {"splits": {split: {"images", "labels", "instances"}}, "histogram": {split: [count per class]},
    #  "samples": [{"split", "image", "boxes": [[class, cx, cy, w, h], …]}]}
    stats = models.JSONField(default=dict, blank=True)
    description = models.CharField(max_length=300, blank=True)
    uploaded_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["team__slug", "name", "-version"]
        constraints = [models.UniqueConstraint(fields=["team", "name", "version"], name="one_dataset_version")]

    def __str__(self) -> str:
        return f"{self.team.slug}/{self.name}:v{self.version}"

    @property
    def reference(self) -> str:
        """How a spec names exactly this version."""
        return f"{self.name}:v{self.version}"

    def task_problem(self, task: str) -> str:
        """Why a ``task`` job (detect, segment, …) cannot train or validate on this version, as the
        end of a sentence about it; '' when it can, or when its labels were never recorded."""
        if self.kind == self.Kind.CLASSIFY:
            return "" if task == "classify" else classification_task_problem(task)
        if self.kind != self.Kind.YOLO:
            return ""
        stats = self.stats or {}
        return label_task_problem(stats.get("labels", ""), task, kpt_shape=bool(stats.get("kpt_shape")))

    def unlabelled_splits(self) -> dict[str, int]:
        """Each split that has images but no labelled object, with its image count: what the upload
        warns of (label_warnings) and what a training's val and a `yolo val` refuse (apps.jobs.inputs).
        A classification dataset counts no instances at all (no key), so it has none."""
        splits = (self.stats or {}).get("splits") or {}
        return {split: counts["images"] for split, counts in splits.items()
                if counts.get("images") and counts.get("instances") == 0}

    def label_warnings(self) -> list[str]:
        """A sentence for each split of a YOLO version that has images but no labelled object: stored
        all the same (a split of backgrounds may be meant), but a training validating on it and a
        `yolo val` of it are refused (apps.jobs.inputs), so the upload's answer and the dataset page
        say so at once (fix31b left: the user learnt it at the training's submit)."""
        if self.kind != self.Kind.YOLO:
            return []
        warnings = []
        for split, images in self.unlabelled_splits().items():
            refused = (f"a training on {self.reference} is refused unless val=false (it validates on this split "
                       "each epoch), and so is validating on it" if split == "val"
                       else f"validating on it (split={split}) is refused" + (", and a training learns only background "
                                                                               "from it" if split == "train" else ""))
            warnings.append(f"the '{split}' split has no labels ({images} images, none with a labelled "
                            f"object): {refused}; upload the labels (labels/{split}/, one .txt per image) as a new version")
        return warnings

    def lineage(self) -> dict:
        """What a job or a model version records about the data it used."""
        return {"id": self.pk, "team": self.team.slug, "name": self.name, "version": self.version,
                "sha256": self.sha256, "kind": self.kind}
