"""Prometheus' own checkers (Debian's prometheus and prometheus-alertmanager packages).

Missing tools skip the test on a developer's machine but fail it under CI=true, where
.ci/run installs them: a CI run must never pass by not checking.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def require(tool: str) -> str:
    path = shutil.which(tool)
    if path:
        return path
    message = f"{tool} is not installed (apt-get install {'prometheus' if tool == 'promtool' else 'prometheus-alertmanager'})"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def run(tool: str, *args: str, stdin: bytes | None = None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([require(tool), *args], input=stdin, capture_output=True, timeout=60, cwd=cwd)
