"""A GPU server's JOBS_DIR fills up while a job trains (the shared DATA_DIR's disk, or the
node's scratch disk with an object store): the training's checkpoint write fails with "No space
left on device". That is no fault of the job: it is requeued to resume from its last checkpoint
(no retry spent), the node takes no new work and says why (its storage problem, queued jobs'
reasons, /metrics) until there is room again, then the job resumes and succeeds.

fault32: both running jobs ended ``failed`` "training process exited with code 1" (their retries
spent first), and the log that would have said why was cut off by the same full disk.

Needs root for the small tmpfs that fills (CI runs as root; docs/deploy.md).
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from apps.cluster.models import Node
from apps.core.storage_marks import MARKER_NAME
from apps.jobs.models import TERMINAL_STATES, Checkpoint, Job, JobEvent, JobState
from tests.conftest import SEED_SPEC, api_client
from tests.monitoring.test_metrics import scrape, value

from .live import wait_for
from .test_shared_storage_live import storage_marked

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs (root; CI runs as root)"),
]
RETRIES = 2


def job_row(job_id) -> Job:
    return Job.objects.get(pk=job_id)


def fill(path) -> None:
    """Write zeros into ``path`` until its filesystem has no room left."""
    block = b"\0" * (1 << 20)
    with open(path, "wb") as f:
        try:
            while True:
                f.write(block)
                f.flush()
        except OSError:
            pass


def test_a_full_jobs_dir_requeues_its_training_and_takes_no_work_until_there_is_room(live, alice, settings, tmp_path):
    mount = tmp_path / "gpu-server" / "jobs"  # the GPU server's JOBS_DIR: a disk of 256 MB
    mount.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(mount)], check=True)
    try:
        live.start_scheduler()
        storage_marked(settings)
        shutil.copy2(settings.JOBS_DIR / MARKER_NAME, mount / MARKER_NAME)
        live.start_worker(JOBS_DIR=str(mount), JOBS_DIR_MIN_FREE_MB="32")
        spec = (
            SEED_SPEC.replace("epochs=2 imgsz=128", "epochs=12 imgsz=64").replace(
                "yolo-v8s-industrial-inspection", "disk-full"
            )
            + f"retries: {RETRIES}\n"
        )
        job_id = api_client(alice).post("/api/v1/jobs/", spec, content_type="application/yaml").json()["id"]
        wait_for(lambda: Checkpoint.objects.filter(job_id=job_id).exists(), 180, what="a first checkpoint")

        filler = mount / "filler"
        fill(filler)  # the disk is full
        wait_for(
            lambda: (
                job_row(job_id).state in TERMINAL_STATES
                or job_row(job_id).attempt > 1
                or JobEvent.objects.filter(job_id=job_id, kind="retry").exists()
            ),
            120,
            what="the training to end on the full disk",
        )
        timeline = list(
            JobEvent.objects.filter(job_id=job_id).order_by("seq").values_list("attempt", "kind", "message")
        )
        assert not [e for e in timeline if e[1] in ("retry", "failed")], timeline
        [requeued] = JobEvent.objects.filter(job_id=job_id, kind="storage_unavailable")
        assert "storage full: JOBS_DIR has " in requeued.message and "(not counted as a retry)" in requeued.message, (
            requeued.message
        )
        node = Node.objects.get(name="node-a")
        assert node.storage_problem.startswith("storage full: JOBS_DIR has "), node.storage_problem
        wait_for(lambda: "node-a (storage full)" in job_row(job_id).reason, 30, what="the queued job's reason")
        assert job_row(job_id).state == JobState.QUEUED  # not placed on the full node again
        assert value(scrape()[1], "yoloportal_node_storage_problem", node="node-a") == 1

        filler.unlink()  # room again
        wait_for(lambda: job_row(job_id).state in TERMINAL_STATES, 400, what="the job to finish")
        job = job_row(job_id)
        assert job.state == JobState.SUCCEEDED, job.error
        assert (job.attempt, job.retries_left) == (2, RETRIES)
        assert Node.objects.get(name="node-a").storage_problem == ""
    finally:
        live.stop_all()
        subprocess.run(["umount", "-l", str(mount)], check=False)
