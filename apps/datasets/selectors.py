from __future__ import annotations

from pathlib import Path

import yaml
from django.conf import settings
from django.db.models import QuerySet

from apps.accounts.selectors import team_ids

from .models import Dataset


def dataset_list(*, user) -> QuerySet[Dataset]:
    return Dataset.objects.filter(team_id__in=team_ids(user=user)).select_related("team")


def team_dataset_root(team) -> Path:
    return (settings.DATASETS_DIR / team.slug).resolve()


def dataset_resolve(*, team, reference: str) -> str:
    """A dataset name registered to ``team``, or a path inside the team's dataset root → data.yaml.

    Raises ValueError with a message fit for the user.
    """
    if not reference:
        raise ValueError("is required")
    registered = Dataset.objects.filter(team=team, name=reference).first()
    if registered:
        return registered.yaml_path
    root = team_dataset_root(team)
    candidate = (root / reference).resolve()
    if not candidate.is_relative_to(root):
        raise ValueError("must be a dataset registered to your team or a path inside its dataset folder")
    if candidate.is_dir():
        candidate = candidate / "data.yaml"
    if candidate.suffix not in {".yaml", ".yml"} or not candidate.is_file():
        names = list(Dataset.objects.filter(team=team).values_list("name", flat=True))
        known = f" (your team has: {', '.join(names)})" if names else " (your team has none registered)"
        raise ValueError(f"unknown dataset {reference!r}{known}")
    data_yaml_check(candidate, root=root)
    return str(candidate)


def data_yaml_check(path: Path, *, root: Path) -> None:
    """Refuse dataset YAMLs Ultralytics would execute or that point outside the team's storage."""
    try:
        document = yaml.safe_load(path.read_text()[: 256 * 1024])
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"dataset YAML cannot be read: {exc}") from None
    if not isinstance(document, dict):
        raise ValueError("dataset YAML must be a mapping")
    if "download" in document:
        raise ValueError("dataset YAML has a 'download' key; Ultralytics would execute it, so it is refused")
    base = Path(document.get("path") or path.parent)
    base = (path.parent / base).resolve() if not base.is_absolute() else base.resolve()
    if not base.is_relative_to(root):
        raise ValueError("dataset YAML 'path' points outside your team's dataset folder")
    for key in ("train", "val", "test"):
        for entry in document.get(key) or [] if isinstance(document.get(key), list) else [document.get(key)]:
            if entry and not (base / str(entry)).resolve().is_relative_to(root):
                raise ValueError(f"dataset YAML '{key}' points outside your team's dataset folder")
