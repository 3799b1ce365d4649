"""Where a spec's ``model=`` comes from: a model YAML, the team's or shared weights, or the registry.

Nothing is downloaded at run time, so a name like ``yolov8s.pt`` must have been uploaded
to the team (``yoloq weights push``) or added as shared weights (``manage.py weights add
--shared``). The rules for weights live in ``apps.registry.selectors``.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from apps.registry.selectors import WeightsRef, version_resolve, version_weights, weights_resolve


@lru_cache(maxsize=1)
def _model_yaml_files() -> dict[str, Path]:
    """Model YAML files that ship with Ultralytics by file name, found without importing it (torch is slow)."""
    spec = importlib.util.find_spec("ultralytics")
    if spec is None or not spec.submodule_search_locations:
        return {}
    root = Path(list(spec.submodule_search_locations)[0]) / "cfg" / "models"
    return {p.name: p for p in sorted(root.rglob("*.yaml"))}


def model_yaml_names() -> frozenset[str]:
    return frozenset(_model_yaml_files())


def _model_yaml_file(name: str) -> Path | None:
    # Ultralytics maps scaled names to one file: yolov8n.yaml -> yolov8.yaml with scale "n".
    unified = re.sub(r"(\d+)([nslmx])(.+)?$", r"\1\3", name)
    files = _model_yaml_files()
    return files.get(name) or files.get(unified)


def model_yaml_known(name: str) -> bool:
    return _model_yaml_file(name) is not None


# The output module (the head's last layer) → the task, as Ultralytics' guess_model_task reads a model
# YAML: Segment, YOLOESegment, Segment26 … are segment. Heads of tasks jobs do not run (semantic
# segmentation, depth, RT-DETR's decoder) give no task.
_HEAD_TASKS = (("semanticsegment", ""), ("depth", ""), ("classify", "classify"), ("detect", "detect"),
               ("segment", "segment"), ("pose", "pose"), ("obb", "obb"))


@lru_cache(maxsize=256)
def model_yaml_task(name: str) -> str:
    """The task a model YAML builds (``yolov8n-seg.yaml`` → segment), as Ultralytics decides it when no
    task is given: from the module of the head's last layer; '' when not known."""
    path = _model_yaml_file(name)
    try:
        head = yaml.safe_load(path.read_text())["head"][-1][-2].lower() if path else ""
    except (OSError, yaml.YAMLError, KeyError, IndexError, TypeError, AttributeError):
        return ""
    if head in ("classify", "classifier", "cls", "fc"):
        return "classify"
    return next((task for word, task in _HEAD_TASKS if word in head), "")


@lru_cache(maxsize=256)
def model_yaml_layers(name: str) -> int:
    """How many layers a model YAML builds: its backbone's rows and its head's, which Ultralytics numbers
    ``model.0`` … ``model.N-1`` (the numbers ``freeze=`` counts); 0 when not known."""
    path = _model_yaml_file(name)
    try:
        document = yaml.safe_load(path.read_text()) if path else {}
        return len(document["backbone"]) + len(document["head"])
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return 0


def freeze_problem(*, freeze: int, model: str) -> str:
    """Why ``freeze=`` cannot train ``model`` ('' when it can, or when that is not known here).

    Ultralytics' trainer freezes the parameters of ``model.{i}.`` for i in ``range(freeze)`` and stops
    with "froze the entire model" when nothing is left to train, so ``freeze`` must be below the layer
    count. (Its list form, layer indices, is refused by the spec parser: ``freeze`` is an integer here.)
    Only a model YAML's layers are known without loading the model: weights (``name.pt``) or a registered
    version would have to be read, or torch imported, on the submit path, so their ``freeze`` is left to
    the trainer's own message at run time."""
    layers = model_yaml_layers(model) if model.endswith((".yaml", ".yml")) else 0
    if not layers or freeze < layers:
        return ""
    return (f"is {freeze}, and {model} has {layers} layers (0 to {layers - 1}): freeze={freeze} would freeze "
            f"every one and leave nothing to train; give at most {layers - 1} (the head, layer {layers - 1}, "
            f"keeps training)")


@dataclass(frozen=True)
class ModelRef:
    """What a spec's ``model=`` resolved to: a model YAML to build, or weights in the store."""

    yaml: str = ""
    weights: WeightsRef | None = None

    def as_input(self) -> dict:
        """What the job records (lineage: no server paths)."""
        return self.weights.parent if self.weights else {"kind": "yaml", "name": self.yaml}

    @property
    def task(self) -> str:
        """The task the model itself defines, which Ultralytics trains and runs whatever the spec's: the
        weights' (as the registry recorded it), or the one a model YAML builds; '' when not known."""
        return self.weights.task if self.weights else model_yaml_task(self.yaml)

    def as_resolved(self) -> dict:
        """What the worker needs: the YAML name, or the weights' key and the sha256 to check them against."""
        return {"yaml": self.yaml} if self.weights is None else {"key": self.weights.key, "sha256": self.weights.sha256}


def model_resolve(*, team, reference: str, yaml_allowed: bool = True) -> ModelRef:
    """A spec's ``model=`` → a model YAML, the team's or shared weights, or a registered version. ValueError."""
    if not reference:
        raise ValueError("is required")
    if reference.endswith((".yaml", ".yml")):
        if not yaml_allowed:
            raise ValueError("must be trained weights (name.pt or a registered model name:v1), not a model YAML")
        if "/" in reference or not model_yaml_known(reference):
            raise ValueError(f"unknown model YAML {reference!r} (e.g. yolov8n.yaml, yolo11s.yaml)")
        return ModelRef(yaml=reference)
    if reference.endswith(".pt"):
        return ModelRef(weights=weights_resolve(team=team, reference=reference))
    if ":" in reference:
        return ModelRef(weights=version_weights(version_resolve(team=team, reference=reference)))
    raise ValueError("must be a model YAML (yolov8n.yaml), weights (name.pt: your team's uploads, then shared "
                     "ones) or a registered model (name:v1, name:latest, name:production)")
