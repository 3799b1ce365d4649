"""File hashing. Plain Python with no Django: the training child imports it too."""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_sha256(path: Path | str) -> str:
    """Hex SHA-256 of a file, read in 1 MiB blocks."""
    return _file_hexdigest(path, hashlib.sha256())


def file_md5_and_sha256(path: Path | str) -> tuple[str, str]:
    """Both, in one read. The MD5 only to compare with an S3 ETag that is one (artifacts_push, which
    then records the sha256 with the object), never to identify content otherwise."""
    md5, sha256 = hashlib.md5(usedforsecurity=False), hashlib.sha256()
    _file_update(path, md5, sha256)
    return md5.hexdigest(), sha256.hexdigest()


def _file_hexdigest(path: Path | str, digest) -> str:
    _file_update(path, digest)
    return digest.hexdigest()


def _file_update(path: Path | str, *digests) -> None:
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            for digest in digests:
                digest.update(block)
