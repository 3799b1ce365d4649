"""The container executor through the real gpu_worker, against a recording runtime shim.

No container runtime works on these machines (REFERENCES.md): the shim records the exact
command line and runs the child on the host, so the event contract (metrics, checkpoints,
logs, outcome) is proven through the container executor; the runtime itself is not.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from apps.jobs.models import Job, JobState
from tests.conftest import SEED_SPEC, api_client

from .live import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
SHIM = Path(__file__).resolve().parents[1] / "worker" / "container_shim.py"


def test_a_job_runs_in_its_image_with_its_limits_through_the_container_executor(live, alice, tmp_path):
    calls = tmp_path / "runtime-calls.jsonl"
    live.start_scheduler()
    live.start_worker(WORKER_EXECUTOR="container", CONTAINER_RUNTIME=str(SHIM), CONTAINER_SHIM_LOG=str(calls),
                      CONTAINER_SHIM_PYTHON=sys.executable)
    response = api_client(alice).post("/api/v1/jobs/", SEED_SPEC.replace("epochs=2", "epochs=1"),
                                      content_type="application/yaml")
    job_id = response.json()["id"]
    wait_for(lambda: Job.objects.get(pk=job_id).state in (JobState.SUCCEEDED, JobState.FAILED), timeout=300,
             what="the job to finish")
    job = Job.objects.get(pk=job_id)
    assert job.state == JobState.SUCCEEDED, job.error
    assert job.node.executor == "container" and [m.epoch for m in job.metrics.all()] == [1]

    run, *rest = [json.loads(line) for line in calls.read_text().splitlines()]
    assert run[:2] == ["run", "--name"] and run[2].startswith(f"yp-{job.attempt_id}")
    assert run[run.index("--memory") + 1] == f"{4 * 2**30}b" and run[run.index("--cpus") + 1] == "1"
    assert run[run.index("--network") + 1] == "none"
    assert f"{job.run_dir}:{job.run_dir}:rw" in run
    assert run[-5:-1] == ["ultralytics/yolov8:latest", "python", "-m", "worker.train_child"]
    assert "--gpus" not in run  # a simulated node: no GPU to pass
    assert [call[0] for call in rest] == ["inspect", "rm"]
