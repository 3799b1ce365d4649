"""A GPU server's artifact cache (worker/cache.py) with a real worker, object store and job:
pruned to ARTIFACTS_CACHE_MAX_GB when the worker starts and after each attempt, while the
dataset a running attempt trains on stays however small the cap."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from apps.jobs.models import Job, JobState
from tests.conftest import SEED_SPEC, api_client
from worker.cache import cache_entries, cache_prune

from .live import fast_trainer, wait_for
from .test_storage_nodes import s3_env

pytestmark = [pytest.mark.integration, pytest.mark.one_database, pytest.mark.django_db(transaction=True)]


def test_a_node_prunes_its_cache_at_start_and_after_a_job_but_not_what_a_job_uses(live, alice, moto, tmp_path,
                                                                                   settings):
    s3 = s3_env(moto)
    pushed = subprocess.run([sys.executable, "manage.py", "artifacts_push"], cwd=settings.BASE_DIR,
                            env=live.env(**s3), capture_output=True, text=True, timeout=600)
    assert pushed.returncode == 0, pushed.stderr
    node_dir = tmp_path / "gpu-server"
    settings.ARTIFACTS_CACHE_DIR = node_dir / "cache"  # the node's default: DATA_DIR/cache
    stale = settings.ARTIFACTS_CACHE_DIR / "ab" / ("ab" * 32)
    stale.mkdir(parents=True)
    (stale / "best.pt").write_bytes(b"w" * 100_000)
    os.utime(stale, (time.time() - 86400, time.time() - 86400))

    live.start_scheduler(**s3)
    live.start_worker(DATA_DIR=str(node_dir), ARTIFACTS_CACHE_MAX_GB="0", **s3, **fast_trainer(1.0))
    wait_for(lambda: not stale.exists(), 60, what="the worker to prune its cache at start")
    job_id = api_client(alice).post("/api/v1/jobs/", SEED_SPEC.replace("epochs=2", "epochs=8"),
                                    content_type="application/yaml").json()["id"]
    wait_for(lambda: Job.objects.get(pk=job_id).epochs_done >= 1, 120, what="the job to train")
    entries = cache_entries()
    assert len(entries) == 1 and (entries[0] / "dataset").is_dir(), entries  # the demo dataset, fetched
    assert cache_prune(max_bytes=0) == (0, 0), "the running attempt's dataset stays"
    wait_for(lambda: Job.objects.get(pk=job_id).state in {JobState.SUCCEEDED, JobState.FAILED}, 120,
             what="the job to finish")
    assert Job.objects.get(pk=job_id).state == JobState.SUCCEEDED
    wait_for(lambda: not cache_entries(), 30, what="the cache to be pruned after the attempt")
