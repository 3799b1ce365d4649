"""Limits that hold (issue 12), with the real scheduler, gpu_worker, cgroups and training.

- A job over its memory limit is killed by the kernel inside its own cgroup and fails with
  the stated reason; the job beside it on the same node trains on to success.
- A job's CPU time stays within the CPUs it asked for (+10%), measured by its cgroup.
- CUDA out of memory (simulated in the child: no GPU here) is retried from the last
  checkpoint with half the batch, and the job succeeds.
"""

from __future__ import annotations

import os
import re

import pytest

from apps.jobs.models import Job, JobEvent, JobState
from tests.conftest import SEED_SPEC, api_client
from worker.executors.cgroups import probe

from .live import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
TERMINAL = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMED_OUT)


@pytest.fixture(autouse=True)
def cgroups_here():
    host = probe()
    if not {"memory", "cpu"} <= set(host.enforced):
        if os.environ.get("CI"):
            pytest.fail(f"CI must run where cgroups are writable: {host.describe()}")
        pytest.skip(host.describe())


def submit(client, spec: str) -> str:
    response = client.post("/api/v1/jobs/", spec, content_type="application/yaml")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def finished(job_id) -> Job:
    return wait_for(lambda: (job := Job.objects.get(pk=job_id)).state in TERMINAL and job, timeout=300,
                    interval=0.5, what=f"job {job_id} to finish")


def resources_of(job_id) -> list[dict]:
    return [e.data for e in JobEvent.objects.filter(job_id=job_id, kind="attempt_resources").order_by("seq")]


def test_a_job_over_its_memory_limit_fails_with_the_reason_and_its_neighbour_succeeds(live, alice):
    live.start_scheduler()
    live.start_worker(gpus=2)
    client = api_client(alice)
    greedy = submit(client, SEED_SPEC.replace("memory: 4Gi", "memory: 96Mi").replace("epochs=2", "epochs=1"))
    neighbour = submit(client, SEED_SPEC.replace("epochs=2", "epochs=1") + "allow_duplicate: true\n")

    greedy_job, neighbour_job = finished(greedy), finished(neighbour)
    assert greedy_job.node_id == neighbour_job.node_id
    assert greedy_job.state == JobState.FAILED
    assert re.fullmatch(r"out of memory: used \d+\.\d MiB of its 96 MiB limit — ask for more memory "
                        r"or a smaller batch/imgsz/cache", greedy_job.error.splitlines()[0]), greedy_job.error
    [usage] = resources_of(greedy)
    assert usage["oom_kills"] >= 1 and usage["memory_limit_bytes"] == 96 * 2**20
    assert neighbour_job.state == JobState.SUCCEEDED, neighbour_job.error
    [usage] = resources_of(neighbour)
    assert usage["oom_kills"] == 0 and usage["memory_limit_bytes"] == 4 * 2**30


def test_a_jobs_cpu_time_stays_within_the_cpus_it_asked_for(live, alice):
    live.start_scheduler()
    live.start_worker()
    job_id = submit(api_client(alice), SEED_SPEC)  # resources: cpu "1"
    job = finished(job_id)
    assert job.state == JobState.SUCCEEDED, job.error
    [usage] = resources_of(job_id)
    assert usage["cpu_seconds"] > 1.0  # it trained, and its cgroup counted it
    assert usage["cpu_seconds"] <= 1.0 * usage["wall_s"] * 1.1, usage


def test_cuda_out_of_memory_is_retried_from_the_checkpoint_with_half_the_batch(live, alice):
    live.start_scheduler()
    live.start_worker(YOLOPORTAL_FAULT_CUDA_OOM_ABOVE_BATCH="4")
    job_id = submit(api_client(alice), SEED_SPEC.replace("imgsz=128", "imgsz=64 batch=8"))
    job = finished(job_id)
    assert job.state == JobState.SUCCEEDED, job.error
    assert job.attempt == 2 and job.retries_left == 0
    assert job.spec["as_run"] == {"batch": 4, "cuda_oom_retries": 1, "batch_history": [8]}
    kinds = list(JobEvent.objects.filter(job_id=job_id).order_by("seq").values_list("kind", "message"))
    [(_, message)] = [k for k in kinds if k[0] == "cuda_oom"]
    assert "CUDA out of memory with batch=8: retrying from its epoch 1 checkpoint with batch=4" in message
    started = [m for k, m in kinds if k == "training_started"]
    assert started == ["training epochs 1..2 with batch=8", "training epochs 2..2 with batch=4"]
    assert [e for e, in Job.objects.get(pk=job_id).metrics.values_list("epoch")] == [1, 2]
