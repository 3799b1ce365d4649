from __future__ import annotations

import os
import secrets
from pathlib import Path


def load_or_create_secret_key(path: Path) -> str:
    """Read the key at ``path``; create it (mode 0600) the first time."""
    if path.exists():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(50)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process of `make run` won the race
        return path.read_text().strip()
    with os.fdopen(fd, "w") as f:
        f.write(key)
    return key
