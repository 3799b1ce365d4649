from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.db.models import QuerySet

from apps.accounts.selectors import team_ids
from apps.core.selectors import scoped_get
from apps.core.strict_yaml import YamlError, load_yaml

from .models import Dataset

DATA_YAML_MAX_BYTES = 256 * 1024
SPLIT_KEYS = ("train", "val", "test", "minival")  # the keys Ultralytics joins onto `path`


def dataset_list(*, user, team: str | None = None) -> QuerySet[Dataset]:
    datasets = Dataset.objects.filter(team_id__in=team_ids(user=user)).select_related("team")
    if team:
        datasets = datasets.filter(team__slug=team)
    return datasets


def dataset_get(*, user, pk) -> Dataset | None:
    return scoped_get(dataset_list(user=user), pk)


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
        path = Path(registered.yaml_path)
        # A registered dataset is confined to its own folder (it may be shared, like the demo).
        data_yaml_check(path, root=path.parent.resolve())
        return registered.yaml_path
    root = team_dataset_root(team)
    if any(part.startswith(".") for part in Path(reference).parts):
        # Uploads in progress (.upload-*) and deleted datasets on their way out (.deleted-*).
        raise ValueError("must not name a hidden folder or file (one starting with '.')")
    candidate = (root / reference).resolve()
    if not candidate.is_relative_to(root) or any(part.startswith(".") for part in candidate.relative_to(root).parts):
        raise ValueError("must be a dataset registered to your team or a path inside its dataset folder")
    if candidate.is_dir():
        candidate = candidate / "data.yaml"
    if candidate.suffix not in {".yaml", ".yml"} or not candidate.is_file():
        names = list(Dataset.objects.filter(team=team).values_list("name", flat=True))
        known = f" (your team has: {', '.join(names)})" if names else " (your team has none registered)"
        raise ValueError(f"unknown dataset {reference!r}{known}")
    data_yaml_check(candidate, root=root)
    return str(candidate)


_checked: dict[tuple[str, str], tuple[int, int, int]] = {}


def data_yaml_check(path: Path, *, root: Path) -> None:
    """:func:`data_yaml_check_uncached`, remembered per (file, root) while the file (its
    modification time and size) and its folder's entries (the folder's modification time:
    a split folder swapped for a link changes it) stay the same. Every submit asks."""
    try:
        stat, folder = path.stat(), path.parent.stat()
    except OSError as exc:
        raise ValueError(f"dataset YAML cannot be read: {exc.strerror or exc}") from None
    key, stamp = (str(path), str(root)), (stat.st_mtime_ns, stat.st_size, folder.st_mtime_ns)
    if _checked.get(key) == stamp:
        return
    data_yaml_check_uncached(path, root=root)
    if len(_checked) > 10_000:
        _checked.clear()
    _checked[key] = stamp


def data_yaml_check_uncached(path: Path, *, root: Path) -> None:
    """Refuse dataset YAMLs Ultralytics would execute or that reach outside ``root``.

    Mirrors how Ultralytics (8.4 ``check_det_dataset``) reads the file: a ``download:``
    key is executed when the val images are missing; a relative ``path`` is resolved
    against the *working directory* or its own datasets folder, so only an absolute
    ``path`` inside ``root`` (or none: the YAML's folder) is accepted; each split is
    joined onto ``path`` and must be a folder inside ``root`` (an image-list ``.txt``
    could name any file on the machine).
    """
    try:
        document = load_yaml(path.read_bytes()[: DATA_YAML_MAX_BYTES + 1], max_bytes=DATA_YAML_MAX_BYTES)
    except OSError as exc:
        raise ValueError(f"dataset YAML cannot be read: {exc.strerror or exc}") from None
    except YamlError as exc:
        raise ValueError(f"dataset YAML {exc.errors.get('spec', exc)}") from None
    if not isinstance(document, dict):
        raise ValueError("dataset YAML must be a mapping")
    if "download" in document:
        raise ValueError("dataset YAML has a 'download' key; Ultralytics would execute it, so it is refused")
    raw_base = document.get("path")
    if raw_base in (None, ""):
        base = path.parent.resolve()
    elif isinstance(raw_base, str) and Path(raw_base).is_absolute():
        base = Path(raw_base).resolve()
    else:
        raise ValueError("dataset YAML 'path' must be an absolute folder inside your team's dataset folder")
    if not base.is_relative_to(root):
        raise ValueError("dataset YAML 'path' points outside your team's dataset folder")
    for key in SPLIT_KEYS:
        value = document.get(key)
        if value in (None, ""):
            continue
        entries = value if isinstance(value, list) else [value]
        for entry in entries:
            if not isinstance(entry, str) or not entry:
                raise ValueError(f"dataset YAML '{key}' must be a folder name or a list of them")
            if ".." in Path(entry).parts:
                raise ValueError(f"dataset YAML '{key}' must not contain '..'")
            target = (base / entry).resolve()
            if not target.is_relative_to(root):
                raise ValueError(f"dataset YAML '{key}' points outside your team's dataset folder")
            if target.exists() and not target.is_dir():
                raise ValueError(f"dataset YAML '{key}' must be a folder of images, not a file")
