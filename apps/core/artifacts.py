"""Artifact keys and where they live on this machine: the one place a key becomes a path.

Rows store *keys*: relative POSIX paths without a leading slash, never absolute paths
(issue 10; the layout is the one proposed in /work/notes/prod.md for issue 11)::

    datasets/<team>/<name>/v<N>/data.yaml     an uploaded dataset version, its files under it
    datasets/_shared/demo/data.yaml           the generated demo dataset
    jobs/<job-uuid>/…                         a job's run folder (weights, predictions, exports)
    models/<team>/<name>/v<N>/<file>          registry files: uploaded weights, exports
    weights/<file>.pt                         the shared weights store (bare names)
    weights/<team>/<file>.pt                  a team's own folder in it (placed by an operator)

The first component names a root, and each root is a setting (``DATASETS_DIR``,
``JOBS_DIR``, ``MODELS_DIR``, ``WEIGHTS_DIR``), so the files stay where they always were.
Issue 11 replaces :func:`artifact_path` with Django's storage API and a node-local cache
keyed by the sha256 recorded next to each key; callers only ever hold keys.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from django.conf import settings

ROOTS = {"datasets": "DATASETS_DIR", "jobs": "JOBS_DIR", "models": "MODELS_DIR", "weights": "WEIGHTS_DIR"}
_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+@-]*$")


class ArtifactKeyError(ValueError):
    """Not a valid artifact key (or a path outside every artifact root)."""


def root_path(root: str) -> Path:
    return Path(getattr(settings, ROOTS[root])).resolve()


def key_check(key: str) -> str:
    """``key`` if it is a well-formed key under a known root; ArtifactKeyError otherwise.

    Well formed: relative, ``/`` separated, no empty, ``.`` or ``..`` parts, no part that
    starts with ``.`` (uploads in progress and deleted folders are hidden), only plain
    file-name characters.
    """
    if not isinstance(key, str) or not key or key.startswith("/") or "\\" in key or len(key) > 500:
        raise ArtifactKeyError(f"not an artifact key: {key!r}")
    parts = key.split("/")
    if parts[0] not in ROOTS or len(parts) < 2:
        raise ArtifactKeyError(f"artifact key {key!r} must start with one of {', '.join(sorted(ROOTS))}/")
    for part in parts[1:]:
        if not _PART.match(part):
            raise ArtifactKeyError(f"artifact key {key!r} has an invalid part {part!r}")
    return key


def key_join(*parts: str) -> str:
    """Join parts into a key and check it (each part may itself hold ``/``)."""
    return key_check(posixpath.join(*[str(p).strip("/") for p in parts]))


def artifact_path(key: str) -> Path:
    """The local file or folder of ``key`` (it need not exist yet)."""
    key_check(key)
    root, _, rest = key.partition("/")
    base = root_path(root)
    path = base.joinpath(*rest.split("/"))
    # Symlinks inside a root (an operator's) are followed only while they stay inside it.
    if path.exists() and not path.resolve().is_relative_to(base):
        raise ArtifactKeyError(f"artifact {key!r} resolves outside its root")
    return path


def artifact_key(path: Path | str) -> str:
    """The key of a local path inside one of the roots (the inverse of :func:`artifact_path`)."""
    resolved = Path(path).resolve()
    # Longest root first: a root may be configured inside another (e.g. DATA_DIR itself).
    for root in sorted(ROOTS, key=lambda r: len(str(root_path(r))), reverse=True):
        base = root_path(root)
        if resolved.is_relative_to(base) and resolved != base:
            return key_check("/".join([root, *resolved.relative_to(base).parts]))
    raise ArtifactKeyError(f"{path} is not inside any artifact root ({', '.join(sorted(ROOTS))})")


def key_part(name: str) -> str:
    """A free-form name (a task name with spaces) as one safe key component."""
    cleaned = re.sub(r"[^A-Za-z0-9_.+@-]+", "_", name).strip("._") or "_"
    return cleaned[:100] if _PART.match(cleaned[:100]) else f"_{cleaned[:99]}"
