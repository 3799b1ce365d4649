"""Services started before `manage.py migrate` (README's multi-node steps taken literally: trial
M2) wait with one clear line instead of logging a traceback every tick, and go on once it has run."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from django.conf import settings

from apps.core.migrated import NOT_MIGRATED

from .live import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_the_scheduler_and_a_worker_on_an_unmigrated_database_wait_for_migrate_then_go_on(live, tmp_path):
    empty = {"DATABASE_URL": f"sqlite:///{tmp_path / 'empty.sqlite3'}", "DATA_DIR": str(tmp_path / "data")}
    for name in ("TEST_DATABASE_PATH", "PYTEST_VERSION", "PYTEST_CURRENT_TEST"):
        empty[name] = ""
    live.start_scheduler(**empty)
    live.start_worker(node="unmigrated", **empty)
    for name in ("scheduler", "worker"):
        wait_for(lambda name=name: NOT_MIGRATED in live.log(name), timeout=60, what=f"the {name}'s line")
    time.sleep(3 * float(live.env()["SCHEDULER_TICK_S"]) + 2)
    for name in ("scheduler", "worker"):
        log = live.log(name)
        assert log.count(NOT_MIGRATED) == 1 and "Traceback" not in log, log

    env = live.env(**empty)
    result = subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], cwd=settings.BASE_DIR, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    wait_for(lambda: "leads with fencing token" in live.log("scheduler"), timeout=60, what="the scheduler to lead")
    wait_for(lambda: "node unmigrated:" in live.log("worker"), timeout=60, what="the worker to register")
    assert "Traceback" not in live.log("scheduler") + live.log("worker")
