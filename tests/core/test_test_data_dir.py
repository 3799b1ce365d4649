"""Two test runs side by side in one checkout, each with a test database of its own, have data
folders of their own too: sharing var/test/gwN, one run's ``clean_storage`` emptied the job folders
under the other's tests (tests/jobs/test_continue.py failed once under load: the checkpoint it had
just written was gone when the continuation copied it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from django.conf import settings


def data_dir(**env: str) -> Path:
    """DATA_DIR as settings compute it in a process started by a pytest run with ``env``."""
    kept = {
        key: value
        for key, value in os.environ.items()
        if not key.endswith("_DIR") and not key.startswith(("PYTEST", "TEST_DATABASE", "DATABASE_URL"))
    }
    result = subprocess.run(
        [sys.executable, "-c", "from django.conf import settings; print(settings.DATA_DIR)"],
        cwd=settings.BASE_DIR,
        env={
            **kept,
            "SECRET_KEY": "x" * 50,
            "DJANGO_SETTINGS_MODULE": "yoloportal.settings",
            "PYTEST_VERSION": "8",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return Path(result.stdout.strip())


def test_runs_with_their_own_test_database_have_their_own_data_folders():
    var = Path(settings.BASE_DIR) / "var" / "test"
    first = data_dir(PYTEST_XDIST_WORKER="gw0", TEST_DATABASE_PATH="/tmp/lead-a.sqlite3")
    second = data_dir(PYTEST_XDIST_WORKER="gw0", TEST_DATABASE_PATH="/tmp/lead-b.sqlite3")
    assert (first, second) == (var / "lead-a" / "gw0", var / "lead-b" / "gw0")
    assert data_dir(TEST_DATABASE_NAME="test_helper") == var / "test_helper"


def test_a_run_without_one_keeps_var_test_per_worker():
    var = Path(settings.BASE_DIR) / "var" / "test"
    assert (data_dir(PYTEST_XDIST_WORKER="gw1"), data_dir()) == (var / "gw1", var)


def test_a_postgresql_run_names_its_folders_after_its_postgresql_database():
    """With both variables set (a helper's usual environment), PostgreSQL uses TEST_DATABASE_NAME
    and SQLite TEST_DATABASE_PATH: the folders are named after the one in use."""
    var = Path(settings.BASE_DIR) / "var" / "test"
    both = {"PYTEST_XDIST_WORKER": "gw0", "TEST_DATABASE_PATH": "/tmp/lead-a.sqlite3", "TEST_DATABASE_NAME": "test_b"}
    assert data_dir(DATABASE_URL="postgres://u:p@127.0.0.1:5462/x", **both) == var / "test_b" / "gw0"
    assert data_dir(**both) == var / "lead-a" / "gw0"
    assert data_dir(DATABASE_URL="sqlite:////tmp/x.sqlite3", **both) == var / "lead-a" / "gw0"
