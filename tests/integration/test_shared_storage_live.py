"""A GPU server whose mount of the shared DATA_DIR drops after its worker started (no object
store): its jobs wait with a clear reason instead of failing, the node takes no new work and
says why (cluster view, /metrics), and once the storage is back the job trains and succeeds.

Before, the worker checked the storage only when it started: the node kept taking jobs and
each one failed for good as a "dataset problem" (dataset YAML not found)."""

from __future__ import annotations

import shutil

import pytest

from apps.cluster.models import Node
from apps.cluster.selectors import cluster_overview, takes_work
from apps.jobs.models import TERMINAL_STATES, Job, JobEvent, JobState
from tests.conftest import SEED_SPEC, api_client
from tests.monitoring.test_metrics import scrape, value

from .live import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def job_row(job_id) -> Job:
    return Job.objects.get(pk=job_id)


def storage_marked(settings) -> None:
    """The scheduler's first chore: the installation's marker in each shared root. A GPU server's
    copy below is its mount of that storage, so it is made after, marker and all."""
    from apps.core.storage_marks import MARKER_NAME

    wait_for(lambda: all((folder / MARKER_NAME).exists() for folder in (settings.DATASETS_DIR, settings.JOBS_DIR)),
             timeout=60, what="the scheduler to mark the shared storage")


def test_a_node_that_lost_the_shared_storage_keeps_its_job_waiting_until_the_storage_is_back(live, alice, settings,
                                                                                             tmp_path):
    # The GPU server's own mount of the shared datasets (a copy here: its settings resolve symlinks);
    # the web machine keeps its view, as a real one does when one GPU server's NFS mount drops.
    mount = tmp_path / "gpu-server" / "datasets"
    unmounted = mount.with_name("datasets.unmounted")
    live.start_scheduler()
    storage_marked(settings)
    shutil.copytree(settings.DATASETS_DIR, mount)
    live.start_worker(DATASETS_DIR=str(mount))
    wait_for(lambda: Node.objects.filter(name="node-a", state=Node.State.ACTIVE).exists(), timeout=180,
             what="the worker to register")
    mount.rename(unmounted)  # the mount drops
    job_id = api_client(alice).post("/api/v1/jobs/", SEED_SPEC, content_type="application/yaml").json()["id"]
    # Handed back by the worker if it was placed before a heartbeat saw the loss; never placed after.
    wait_for(lambda: job_row(job_id).state in TERMINAL_STATES
             or "shared storage unreachable" in job_row(job_id).reason,
             timeout=120, what="the job to wait for the shared storage")
    job = job_row(job_id)
    assert job.state == JobState.QUEUED, (job.state, job.error)
    assert "node-a (shared storage unreachable)" in job.reason, job.reason
    assert not JobEvent.objects.filter(job_id=job_id, kind__in=["failed", "retry"]).exists()
    assert job.attempt == 1

    node = Node.objects.get(name="node-a")
    assert node.storage_problem == "shared storage unreachable: DATASETS_DIR (no storage marker)"
    assert node.state == Node.State.ACTIVE  # reporting, and not drained: only unfit for work
    (shown,) = cluster_overview(user=alice)
    assert shown["storage_problem"] == node.storage_problem and not takes_work(shown)
    assert value(scrape()[1], "yoloportal_node_storage_problem", node="node-a") == 1
    wait_for(lambda: f"{mount}/.yoloportal-storage" in live.log("worker"), timeout=30,
             what="the worker's log to name what it lacks")

    unmounted.rename(mount)  # mounted again
    wait_for(lambda: job_row(job_id).state in TERMINAL_STATES, timeout=400, what="the job to finish")
    job = job_row(job_id)
    assert job.state == JobState.SUCCEEDED, job.error
    assert job.attempt == 1  # a handed-back placement keeps its number
    assert Node.objects.get(name="node-a").storage_problem == ""
    assert value(scrape()[1], "yoloportal_node_storage_problem", node="node-a") == 0


def test_a_job_training_when_the_mount_drops_is_requeued_not_failed_and_resumes_once_it_is_back(live, alice, settings,
                                                                                              tmp_path):
    """The whole shared DATA_DIR of the GPU server goes mid-training: its checkpoint writes fail and
    the training exits. That is the node's storage, not the job: requeued (no retry spent), resumed
    from its last stored checkpoint once the storage is back."""
    from apps.jobs.models import Checkpoint

    from .live import fast_trainer

    server = tmp_path / "gpu-server"  # its mount of the shared storage: datasets and job folders
    unmounted = server.with_name("gpu-server.unmounted")
    live.start_scheduler()
    storage_marked(settings)
    shutil.copytree(settings.DATASETS_DIR, server / "datasets")
    (server / "jobs").mkdir()
    shutil.copy2(settings.JOBS_DIR / ".yoloportal-storage", server / "jobs")
    live.start_worker(DATASETS_DIR=str(server / "datasets"), JOBS_DIR=str(server / "jobs"), **fast_trainer(1.0))
    spec = SEED_SPEC.replace("epochs=2", "epochs=8").replace("task_name: ", "retries: 1\ntask_name: ")
    job_id = api_client(alice).post("/api/v1/jobs/", spec, content_type="application/yaml").json()["id"]
    wait_for(lambda: Checkpoint.objects.filter(job_id=job_id, epoch__gte=2).exists(), timeout=180,
             what="two stored checkpoints")
    server.rename(unmounted)  # the mount drops mid-training
    try:
        wait_for(lambda: job_row(job_id).state != JobState.RUNNING, timeout=60, what="the attempt to end")
        job = job_row(job_id)
        assert job.state == JobState.QUEUED, (job.state, job.error)
        requeued = JobEvent.objects.get(job_id=job_id, kind="storage_unavailable")
        assert "node-a lost the shared storage while the attempt ran" in requeued.message
        assert (job.attempt, job.retries_left) == (2, 1)  # a new attempt, no retry spent
        assert not JobEvent.objects.filter(job_id=job_id, kind__in=["failed", "retry"]).exists()
        wait_for(lambda: "node-a (shared storage unreachable)" in job_row(job_id).reason, timeout=30,
                 what="the queued job's reason")
        assert Node.objects.get(name="node-a").storage_problem
    finally:
        unmounted.rename(server)  # mounted again
    wait_for(lambda: job_row(job_id).state in TERMINAL_STATES, timeout=180, what="the job to finish")
    job = job_row(job_id)
    assert job.state == JobState.SUCCEEDED, job.error
    assert (job.attempt, job.retries_left) == (2, 1)
    assert JobEvent.objects.filter(job_id=job_id, kind="resuming", attempt=2).exists()
