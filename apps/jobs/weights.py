"""Where a spec's ``model=`` comes from: a model YAML, the local weights store, or the registry.

Nothing is downloaded at run time, so a name like ``yolov8n.pt`` must already be in
``WEIGHTS_DIR`` (or the team's subfolder of it).
"""

from __future__ import annotations

import importlib.util
import re
from functools import lru_cache
from pathlib import Path

from django.conf import settings


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


def model_resolve(*, team, reference: str) -> str:
    """Return what the trainer loads: a YAML name or an absolute weights path. ValueError if unknown."""
    if not reference:
        raise ValueError("is required")
    if reference.endswith((".yaml", ".yml")):
        if "/" in reference or not model_yaml_known(reference):
            raise ValueError(f"unknown model YAML {reference!r} (e.g. yolov8n.yaml, yolo11s.yaml)")
        return reference
    if reference.endswith(".pt"):
        return weights_resolve(team=team, reference=reference)
    match = re.fullmatch(r"([\w.-]+):(v(\d+)|latest)", reference)
    if match:
        from apps.registry.models import ModelVersion

        versions = ModelVersion.objects.filter(team=team, name=match.group(1))
        version = versions.filter(version=int(match.group(3))).first() if match.group(3) else versions.order_by("-version").first()
        if version is None:
            raise ValueError(f"no registered model {reference!r} in your team")
        return version.weights_path
    raise ValueError("must be a model YAML (yolov8n.yaml), weights in the local store (name.pt) or a registered model (name:v1)")


def weights_resolve(*, team, reference: str) -> str:
    """``name.pt`` → an absolute path in the team's own weights folder or the shared store.

    1. The team's folder (``WEIGHTS_DIR/<team>/``): any path inside it, symlinks resolved.
    2. The shared store: a bare file name only, a regular file directly in ``WEIGHTS_DIR``
       (after resolving symlinks). Team folders live inside ``WEIGHTS_DIR`` too, so a path
       with a ``/`` must never reach the shared fallback: ``robotics/secret.pt`` would be
       another team's weights (issue 9, finding 1).
    """
    own = (settings.WEIGHTS_DIR / team.slug).resolve()
    path = (own / reference).resolve()
    if path.is_relative_to(own) and path.is_file():
        return str(path)
    if "/" in reference:
        raise ValueError(
            f"weights {reference!r} are not in your team's weights folder; shared weights are named by a "
            "bare file name (e.g. yolov8n.pt), and other teams' folders are not readable"
        )
    shared = settings.WEIGHTS_DIR.resolve()
    path = (shared / reference).resolve()
    if path.parent == shared and path.is_file():
        return str(path)
    raise ValueError(
        f"weights {reference!r} are not in the local weights store; nothing is downloaded here — "
        "use a model YAML (e.g. yolov8n.yaml) or a registered model (name:v1)"
    )
