from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from django.conf import settings
from django.db.models import QuerySet

from apps.accounts.selectors import team_ids
from apps.core.artifacts import ArtifactKeyError, artifact_key, artifact_path, key_join
from apps.core.prepared import PreparedRead
from apps.core.selectors import scoped_get
from apps.core.storage import shared_filesystem
from apps.core.strict_yaml import YamlError, load_yaml

from .models import Dataset

DATA_YAML_MAX_BYTES = 256 * 1024
SPLIT_KEYS = ("train", "val", "test", "minival")  # the keys Ultralytics joins onto `path`


def dataset_list(*, user, team: str | None = None, name: str | None = None) -> QuerySet[Dataset]:
    datasets = Dataset.objects.filter(team_id__in=team_ids(user=user)).select_related("team")
    if team:
        datasets = datasets.filter(team__slug=team)
    if name:
        datasets = datasets.filter(name=name)
    return datasets


def dataset_get(*, user, pk) -> Dataset | None:
    return scoped_get(dataset_list(user=user), pk)


def team_dataset_root(team) -> Path:
    return (settings.DATASETS_DIR / team.slug).resolve()


@dataclass(frozen=True)
class DataRef:
    """What a spec's dataset reference resolved to: a registered version, or a path in the team's root."""

    yaml_key: str  # '' for an images-only upload
    folder_key: str
    dataset: Dataset | None = None

    def lineage(self) -> dict:
        """What a job records about its data (no server paths)."""
        if self.dataset is not None:
            return self.dataset.lineage()
        return {"key": self.yaml_key, "sha256": "", "registered": False}


VERSION_MAX = 2**31 - 1  # Dataset.version is a PositiveIntegerField
_VERSIONED = re.compile(r"^(?P<name>[A-Za-z0-9][\w-]*?)(?:\.ya?ml)?(?::(?:v(?P<version>\d+)|latest))?$")


_NEWEST = PreparedRead(lambda team_id, name: Dataset.objects.filter(team_id=team_id, name=name).order_by("-version")[:1],
                       samples=({"team_id": 1, "name": "a"}, {"team_id": 2, "name": "b"}))
_VERSION = PreparedRead(lambda team_id, name, version: Dataset.objects.filter(
    team_id=team_id, name=name, version=version).order_by()[:1],
    samples=({"team_id": 1, "name": "a", "version": 3}, {"team_id": 2, "name": "b", "version": 4}))


def dataset_version_read(*, team, name: str, version: int | None = None) -> tuple[PreparedRead, dict[str, Any]]:
    """The prepared read :func:`dataset_version_get` makes, with its values (for ``reads_ahead``)."""
    if version:
        return _VERSION, {"team_id": team.pk, "name": name, "version": version}
    return _NEWEST, {"team_id": team.pk, "name": name}


def dataset_version_get(*, team, name: str, version: int | None = None) -> Dataset | None:
    """The given version of a team's dataset, or its newest one (SQL compiled once per connection:
    submit's hot path)."""
    read, values = dataset_version_read(team=team, name=name, version=version)
    rows = read(**values)
    row = rows[0] if rows else None
    if row is not None:
        row.team = team  # the caller's row: no join to read it again
    return row


def dataset_resolve(*, team, reference: str, kinds: tuple[str, ...] = (Dataset.Kind.YOLO,)) -> DataRef:
    """A spec's ``data=`` (or ``source=``) → the dataset version it means. ValueError with a message fit for the user.

    1. A registered name, optionally with the ``.yaml``/``.yml`` suffix the Ultralytics CLI
       habit adds and a version: ``pcb_defect``, ``pcb_defect.yaml``, ``pcb_defect:v2``,
       ``pcb_defect:latest`` (newest, the default).
    2. Else a path inside the team's dataset root (a folder holding data.yaml, or the
       YAML); a path into a registered version's folder means that version.
    ``kinds``: which kinds of upload fit (train and val need labels; predict takes images too).
    """
    if not reference:
        raise ValueError("is required")
    match = _VERSIONED.match(reference)
    if match:
        name, version = match.group("name"), match.group("version")
        number = _version_number(version)
        registered = dataset_version_get(team=team, name=name, version=number) if number != 0 else None
        if registered is None and version and Dataset.objects.filter(team=team, name=name).exists():
            known = ", ".join(f"v{v}" for v in Dataset.objects.filter(team=team, name=name)
                              .order_by("version").values_list("version", flat=True))
            raise ValueError(f"dataset {name!r} has no version {version} (it has {known})")
        if registered is not None:
            return _registered_ref(registered, kinds)
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
        names = sorted(set(Dataset.objects.filter(team=team).values_list("name", flat=True)))
        raise ValueError(f"unknown dataset {reference!r}{_known_names(reference, names)}")
    data_yaml_check(candidate, root=root)
    yaml_key = artifact_key(candidate)
    registered = Dataset.objects.filter(team=team, yaml_key=yaml_key).order_by("-version").first()
    if registered is not None:
        return _registered_ref(registered, kinds)
    return DataRef(yaml_key=yaml_key, folder_key=artifact_key(candidate.parent))


def _version_number(version: str | None) -> int | None:
    """A reference's version as the number to read (None: the newest), or 0 for one that no version
    can have: v0 was read as "the newest" (0 is falsy), and a number past the column's integers was
    an OverflowError from the database (a 500) (sec19, F7)."""
    number = int(version) if version else None
    return number if number is None or 1 <= number <= VERSION_MAX else 0


def dataset_reads_ahead(*, team, reference: str) -> list[tuple[PreparedRead, dict[str, Any]]]:
    """The read :func:`dataset_resolve` makes first for ``reference`` (none for a plain path), so a
    submit can read it ahead with its other reads (``apps.core.prepared.reads_ahead``)."""
    match = _VERSIONED.match(reference) if reference else None
    number = _version_number(match.group("version")) if match else 0
    return [dataset_version_read(team=team, name=match.group("name"), version=number)] if number != 0 else []


KNOWN_NAMES_SHOWN = 10


def _known_names(reference: str, names: list[str]) -> str:
    """What an unknown ``data=`` is told: the closest names first ("did you mean"), then the team's
    names up to :data:`KNOWN_NAMES_SHOWN` (a team of many datasets got every one of them in the
    400, and a typo had to be spotted among them: new-user trial 20)."""
    if not names:
        return " (your team has none registered)"
    typed = _VERSIONED.match(reference)
    close = difflib.get_close_matches(typed.group("name") if typed else reference, names, n=3, cutoff=0.6)
    listed = ", ".join(names[:KNOWN_NAMES_SHOWN])
    more = f" and {len(names) - KNOWN_NAMES_SHOWN} more" if len(names) > KNOWN_NAMES_SHOWN else ""
    guess = f"; did you mean {' or '.join(close)}?" if close else ""
    return f" (your team has: {listed}{more}){guess}"


def _registered_ref(dataset: Dataset, kinds: tuple[str, ...]) -> DataRef:
    if dataset.kind not in kinds:
        if dataset.kind == Dataset.Kind.CLASSIFY:
            raise ValueError(f"dataset {dataset.reference} is a classification dataset (a folder of images per "
                             "class), which only train, val and predict jobs and the export of a classify model use")
        raise ValueError(f"dataset {dataset.reference} is an upload of images without labels; "
                         "only predict jobs can use it (source=…)")
    if not shared_filesystem():
        # An object store: this web machine need not have the files (another one received the
        # upload). Nothing to read here: the data.yaml was checked when the version was made
        # (dataset_register / dataset_upload, on the machine that had it), the version's manifest
        # sha256 (every file, data.yaml included) goes into the job's spec now, and a GPU server
        # trains only from fetched files with that manifest (worker.artifacts.dataset_local).
        return DataRef(yaml_key=dataset.yaml_key, folder_key=dataset.key, dataset=dataset)
    if dataset.kind in (Dataset.Kind.YOLO, Dataset.Kind.CLASSIFY):
        path = artifact_path(dataset.yaml_key)
        # A registered dataset is confined to its own folder (it may be shared, like the demo).
        data_yaml_check(path, root=path.parent.resolve())
    elif not artifact_path(dataset.key).is_dir():
        raise ValueError(f"the files of dataset {dataset.reference} are gone")
    return DataRef(yaml_key=dataset.yaml_key, folder_key=dataset.key, dataset=dataset)


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


SAMPLE_TYPES = {".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".png": "image/png", ".bmp": "image/bmp",
                ".webp": "image/webp", ".tif": "image/tiff", ".tiff": "image/tiff", ".avif": "image/avif"}
SAMPLE_MAX_BYTES = 20 * 1024**2


def dataset_sample_key(dataset: Dataset, index: int) -> tuple[str, str] | None:
    """(artifact key, content type) of sample ``index`` in the artifact store, or None: the
    same rule as :func:`dataset_sample_path` for a web machine without the shared DATA_DIR
    (a key cannot leave its folder: no ``..`` or hidden parts)."""
    samples = (dataset.stats or {}).get("samples") or []
    if not 0 <= index < len(samples) or not dataset.key:
        return None
    image = str(samples[index].get("image") or "")
    content_type = SAMPLE_TYPES.get(PurePosixPath(image).suffix.lower())
    try:
        key = key_join(dataset.key, image)
    except ArtifactKeyError:
        return None
    if not content_type or not key.startswith(dataset.key + "/"):
        return None
    return key, content_type


def dataset_sample_path(dataset: Dataset, index: int) -> tuple[Path, str] | None:
    """(file, content type) of sample ``index`` of the dataset's page, or None.

    Only the files recorded as samples at upload are served, and only from inside the
    version's own folder, as images with their own type (never as HTML or SVG).
    """
    samples = (dataset.stats or {}).get("samples") or []
    if not 0 <= index < len(samples) or not dataset.key:
        return None
    folder = artifact_path(dataset.key).resolve()
    path = (folder / samples[index]["image"]).resolve()
    content_type = SAMPLE_TYPES.get(path.suffix.lower())
    if not content_type or not path.is_relative_to(folder) or not path.is_file():
        return None
    if path.stat().st_size > SAMPLE_MAX_BYTES:
        return None
    return path, content_type
