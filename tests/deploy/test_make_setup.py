"""`make setup` installs when what the install reads changed, not when a file is merely newer.

The real Makefile runs in a copy of its inputs with a stand-in venv whose ``python`` records
each ``pip install`` instead of installing (a real install downloads ~7 GB)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings

ROOT = Path(settings.BASE_DIR)
INPUTS = ("Makefile", "requirements.txt", "requirements-dev.txt", "pyproject.toml")

# Records its arguments; ``-m venv DIR`` makes DIR a venv whose python is this same script.
STAND_IN = """#!/bin/sh
echo "$*" >> "{log}"
if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin" && cp "$0" "$3/bin/python"; fi
"""


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    for name in INPUTS:
        shutil.copy2(ROOT / name, tmp_path / name)
    return tmp_path


def setup_runs(checkout: Path, *, venv_python: bool = True) -> list[str]:
    """Run ``make setup``; the commands the venv's python (or the interpreter making it) was given."""
    log = checkout / "calls.log"
    log.unlink(missing_ok=True)
    stand_in = checkout / "stand-in-python"
    stand_in.write_text(STAND_IN.format(log=log))
    stand_in.chmod(0o755)
    venv = checkout / "venv"
    if venv_python and not (venv / "bin" / "python").exists():
        (venv / "bin").mkdir(parents=True)
        shutil.copy2(stand_in, venv / "bin" / "python")
    # PYTHON hashes the inputs (the real interpreter); making a venv goes through the stand-in.
    maker = checkout / "maker"
    maker.write_text(f'#!/bin/sh\nif [ "$1" = "-m" ]; then exec "{stand_in}" "$@"; fi\nexec "{sys.executable}" "$@"\n')
    maker.chmod(0o755)
    done = subprocess.run(
        ["make", "-s", "setup", f"VENV={venv}", f"PYTHON={maker}"],
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "MAKEFLAGS": ""},
    )
    assert done.returncode == 0, done.stderr
    return log.read_text().splitlines() if log.exists() else []


def installs(calls: list[str]) -> bool:
    return any(call.startswith("-m pip install -q --no-deps -e .") for call in calls)


def test_a_fresh_clone_without_a_venv_makes_one_and_installs(checkout):
    calls = setup_runs(checkout, venv_python=False)
    assert calls[0].startswith("-m venv") and installs(calls)
    assert (checkout / "venv" / ".installed-stamp").read_text().strip()


def test_a_newer_checkout_of_the_same_files_does_not_reinstall_into_the_venv(checkout):
    """A git worktree's checkout is newer than the shared venv's stamp: the mtime rule reinstalled."""
    assert installs(setup_runs(checkout))
    later = time.time() + 60
    for name in INPUTS[1:]:
        os.utime(checkout / name, (later, later))
    assert setup_runs(checkout) == []


@pytest.mark.parametrize("changed", INPUTS[1:])
def test_an_edit_to_what_the_install_reads_reinstalls(checkout, changed):
    assert installs(setup_runs(checkout))
    with open(checkout / changed, "a") as file:
        file.write("\n# an edit\n")
    assert installs(setup_runs(checkout))
    assert setup_runs(checkout) == []


def test_a_venv_whose_stamp_is_gone_installs_again(checkout):
    assert installs(setup_runs(checkout))
    (checkout / "venv" / ".installed-stamp").unlink()
    assert installs(setup_runs(checkout))
