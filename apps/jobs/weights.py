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

from apps.registry.selectors import WeightsRef, version_resolve, version_weights, weights_resolve


@lru_cache(maxsize=1)
def model_yaml_names() -> frozenset[str]:
    """Model YAML file names that ship with Ultralytics, found without importing it (torch is slow)."""
    spec = importlib.util.find_spec("ultralytics")
    if spec is None or not spec.submodule_search_locations:
        return frozenset()
    root = Path(list(spec.submodule_search_locations)[0]) / "cfg" / "models"
    return frozenset(p.name for p in root.rglob("*.yaml"))


def model_yaml_known(name: str) -> bool:
    # Ultralytics maps scaled names to one file: yolov8n.yaml -> yolov8.yaml with scale "n".
    unified = re.sub(r"(\d+)([nslmx])(.+)?$", r"\1\3", name)
    return name in model_yaml_names() or unified in model_yaml_names()


@dataclass(frozen=True)
class ModelRef:
    """What a spec's ``model=`` resolved to: a model YAML to build, or weights in the store."""

    yaml: str = ""
    weights: WeightsRef | None = None

    def as_input(self) -> dict:
        """What the job records (lineage: no server paths)."""
        return self.weights.parent if self.weights else {"kind": "yaml", "name": self.yaml}

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
