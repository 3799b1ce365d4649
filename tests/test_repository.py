"""The repository itself: nothing machine-local is committed."""

from __future__ import annotations

import subprocess
from pathlib import Path

from django.conf import settings

ROOT = Path(settings.BASE_DIR)


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)


def test_no_virtualenv_is_tracked():
    """A tracked .venv (a worktree's symlink) replaces the shared venv directory on merge, deleting it."""
    assert git("ls-files", "--", ".venv", "venv").stdout == ""

