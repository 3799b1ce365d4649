"""File hashing. Plain Python with no Django: the training child imports it too."""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_sha256(path: Path | str) -> str:
    """Hex SHA-256 of a file, read in 1 MiB blocks."""
    return _file_hexdigest(path, hashlib.sha256())


def file_md5(path: Path | str) -> str:
    """Hex MD5 of a file: only to compare with an S3 ETag that is one (artifacts_push), never to
    identify content otherwise."""
    return _file_hexdigest(path, hashlib.md5(usedforsecurity=False))


def _file_hexdigest(path: Path | str, digest) -> str:
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()
