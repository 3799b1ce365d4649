"""The whole path with real parts: API → scheduler → gpu_worker → ultralytics → results."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from apps.jobs.models import Job, JobState
from tests.conftest import SEED_SPEC, api_client

from .live import training_processes, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def job_state(job_id) -> str:
    return Job.objects.values_list("state", flat=True).get(pk=job_id)


def test_it_trains_a_submitted_job_to_success_with_metrics_and_weights(live, alice):
    live.start_scheduler()
    live.start_worker()
    client = api_client(alice)

    response = client.post("/api/v1/jobs/", SEED_SPEC, content_type="application/yaml")
    assert response.status_code == 201, response.content
    job_id = response.json()["id"]

    seen = set()

    def finished():
        state = job_state(job_id)
        seen.add(state)
        return state in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMED_OUT)

    wait_for(finished, timeout=240, interval=0.1, what="the job to finish")
    job = client.get(f"/api/v1/jobs/{job_id}/").json()
    assert job["state"] == "succeeded", job["error"]
    assert {"running", "succeeded"} <= seen
    assert job["node"] == "node-a" and job["simulated"] is True

    metrics = client.get(f"/api/v1/jobs/{job_id}/metrics/").json()["results"]
    assert [m["epoch"] for m in metrics] == [1, 2]
    assert all("train/box_loss" in m["values"] and "metrics/mAP50(B)" in m["values"] for m in metrics)

    from apps.core.artifacts import artifact_path

    weights = artifact_path(Job.objects.get(pk=job_id).weights_path)  # rows hold artifact keys
    assert weights.is_file() and weights.stat().st_size > 100_000
    kinds = [e["kind"] for e in client.get(f"/api/v1/jobs/{job_id}/events/").json()["results"]]
    assert kinds[0] == "submitted" and kinds[-1] == "succeeded" and "running" in kinds
    assert client.get("/api/v1/models/").json()["results"][0]["job"] == job_id
    logs = client.get(f"/api/v1/jobs/{job_id}/logs/").json()["results"]
    assert any("Ultralytics" in chunk["text"] for chunk in logs)


@pytest.mark.one_database
def test_it_cancels_a_running_job_and_kills_its_process_tree(live, alice):
    live.start_scheduler()
    live.start_worker()
    client = api_client(alice)
    spec = SEED_SPEC.replace("epochs=2", "epochs=200")
    job_id = client.post("/api/v1/jobs/", spec, content_type="application/yaml").json()["id"]

    wait_for(lambda: Job.objects.get(pk=job_id).epochs_done >= 1, timeout=180, what="the first epoch")
    pids = training_pids(job_id)
    assert pids, "the training child should be running"

    response = client.post(f"/api/v1/jobs/{job_id}/cancel/")
    assert response.status_code == 202
    wait_for(lambda: job_state(job_id) == JobState.CANCELLED, timeout=20, what="the job to be cancelled")
    wait_for(lambda: not any(alive(pid) for pid in pids), timeout=10, what="the training processes to exit")
    assert client.get(f"/api/v1/jobs/{job_id}/").json()["gpus"] is not None


def training_pids(job_id) -> list[int]:
    return training_processes().get(str(job_id), [])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        # After the command's name, which may hold spaces: a child forked by the zygote is
        # retitled "python -m worker.train_child …", so its comm is "(python -m worke)".
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
