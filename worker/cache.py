"""A GPU node's artifact cache (``ARTIFACTS_CACHE_DIR``) kept under ``ARTIFACTS_CACHE_MAX_GB``.

With an object store a node keeps what it fetched — datasets, weights, resume checkpoints —
in ``<cache>/<tag[:2]>/<tag>/`` (one *entry* per content hash; apps/core/storage.py,
worker/artifacts.py), so the next job on the same inputs starts without a download. Nothing
removed them: a busy node's disk filled with every dataset version it ever trained on.

1. An attempt *holds* each entry it uses (:func:`cache_entry_hold`) from before the fetch until
   it ends: a shared ``flock`` on ``<entry>/.in-use``, which dies with the process, so a killed
   work-horse leaves nothing held. Holding also touches the entry: its mtime is its last use.
2. :func:`cache_prune` (at worker start and after each attempt) adds up the entries and, while
   the total is over the cap, removes the least recently used entry no process holds (an
   exclusive ``flock`` it can take without waiting). Entries in use stay even over the cap.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
from pathlib import Path

from django.conf import settings

log = logging.getLogger(__name__)
HOLD_FILE = ".in-use"


def cache_entry(tag: str) -> Path:
    """The folder of one cached artifact: ``<cache>/<tag[:2]>/<tag>`` (a sha256 or a dataset tag)."""
    return Path(settings.ARTIFACTS_CACHE_DIR) / tag[:2] / tag


def cache_entry_hold(entry: Path) -> int:
    """Hold ``entry`` for this process (a file descriptor: closing it lets go) and mark it used now.

    Made before the fetch that fills it, so the pruner of another slot cannot remove it
    between the download and the training that reads it. If the pruner removed the entry
    while this waited for the lock, the lock is on a removed file: take it again."""
    while True:
        entry.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(entry / HOLD_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        fcntl.flock(descriptor, fcntl.LOCK_SH)
        try:
            current = os.stat(entry / HOLD_FILE).st_ino == os.fstat(descriptor).st_ino
        except FileNotFoundError:
            current = False
        if current:
            os.utime(entry)
            return descriptor
        os.close(descriptor)


def cache_entries() -> list[Path]:
    root = Path(settings.ARTIFACTS_CACHE_DIR)
    if not root.is_dir():
        return []
    return [entry for shard in root.iterdir() if shard.is_dir() and not shard.name.startswith(".")
            for entry in shard.iterdir() if entry.is_dir() and not entry.name.startswith(".")]


def _size(entry: Path) -> int:
    total = 0
    for folder, _, files in os.walk(entry):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except FileNotFoundError:
                pass
    return total


def _remove_unless_held(entry: Path) -> bool:
    try:
        descriptor = os.open(entry / HOLD_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except FileNotFoundError:  # removed meanwhile (another slot's pruner)
        return False
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # an attempt on this node is using it
        shutil.rmtree(entry, ignore_errors=True)
        return not entry.exists()
    finally:
        os.close(descriptor)


def cache_prune(*, max_bytes: int | None = None) -> tuple[int, int]:
    """Remove least recently used entries nobody holds until the cache fits its cap;
    (entries removed, bytes freed)."""
    if max_bytes is None:
        max_bytes = int(settings.ARTIFACTS_CACHE_MAX_GB * 2**30)
    entries = cache_entries()
    sizes = {entry: _size(entry) for entry in entries}
    total = sum(sizes.values())
    removed = freed = 0
    for entry in sorted(entries, key=lambda e: e.stat().st_mtime if e.exists() else 0):
        if total <= max_bytes:
            break
        if _remove_unless_held(entry):
            total -= sizes[entry]
            removed, freed = removed + 1, freed + sizes[entry]
    if removed:
        log.info("artifact cache: removed %d least recently used entr%s (%.1f MiB) to stay under %.1f GiB; "
                 "%.1f GiB kept", removed, "y" if removed == 1 else "ies", freed / 2**20, max_bytes / 2**30,
                 total / 2**30)
    if total > max_bytes:
        log.warning("artifact cache: %.1f GiB is over its %.1f GiB cap (ARTIFACTS_CACHE_MAX_GB): what is left "
                    "is in use by this node's jobs", total / 2**30, max_bytes / 2**30)
    return removed, freed
