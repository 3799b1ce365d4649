from __future__ import annotations

import os
import secrets
from pathlib import Path


def load_or_create_secret_key(path: Path) -> tuple[str, tuple[Path, ...]]:
    """Read the key at ``path``; create it (mode 0600) the first time.

    Returns the key and what this call made for it: the file, then the folders it made to hold
    it, deepest first; nothing when the key was there. A command that is refused before it has
    done anything (``manage.py restore``, apps/core/backup.py) removes them, so that the data
    folder is left as it was found.
    """
    if path.exists():
        return path.read_text().strip(), ()
    missing = tuple(folder for folder in (path.parent, *path.parent.parents) if not folder.exists())
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(50)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process of `make run` won the race
        return path.read_text().strip(), ()
    with os.fdopen(fd, "w") as f:
        f.write(key)
    return key, (path, *missing)
