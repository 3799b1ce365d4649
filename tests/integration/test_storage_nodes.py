"""A GPU server without the shared DATA_DIR (issue 11, "Storage beyond one disk"): artifacts
in an S3-compatible store (a real moto_server process), the worker fetches the dataset into
its own hash-keyed cache, uploads the weights, and the web serves them from the store; while
the store is down a finished job waits with a clear reason and succeeds once it is back."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys

import boto3
import pytest
from django.test import override_settings

from apps.core.artifacts import artifact_path
from apps.jobs.models import Job, JobEvent, JobState
from apps.registry.models import ModelVersion
from tests.conftest import SEED_SPEC, api_client
from tests.s3 import create_bucket, s3_storages, start_moto, stop_moto

from .live import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


SWEEP_SPEC = """\
task_name: store-sweep
command: "yolo train data=demo model=yolov8n.yaml epochs=1 imgsz=64 optimizer=SGD"
resources: {gpu: 1}
user: vision
timeout: 3600
sweep: {method: grid, parameters: {lr0: [0.01]}}
"""


def s3_env(moto) -> dict[str, str]:
    return {"ARTIFACTS_S3_BUCKET": moto["bucket"], "ARTIFACTS_S3_ENDPOINT_URL": moto["url"],
            "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


def downloaded_sha256(client, job_id) -> str:
    """The sha256 of the job's weights as the web serves them (a 200)."""
    response = client.get(f"/api/v1/jobs/{job_id}/weights/")
    assert response.status_code == 200
    digest = hashlib.sha256(b"".join(response.streaming_content)).hexdigest()
    response.close()
    return digest


def state(job_id) -> str:
    return Job.objects.values_list("state", flat=True).get(pk=job_id)


def test_a_worker_without_the_shared_data_dir_trains_from_and_into_object_storage(live, alice, moto, tmp_path,
                                                                                   settings):
    s3 = s3_env(moto)
    # Moving the existing DATA_DIR into the store: the demo dataset among it.
    pushed = subprocess.run([sys.executable, "manage.py", "artifacts_push"], cwd=settings.BASE_DIR,
                            env=live.env(**s3), capture_output=True, text=True, timeout=600)
    assert pushed.returncode == 0, pushed.stderr
    assert "pushed" in pushed.stdout

    node_dir = tmp_path / "gpu-server"  # its own DATA_DIR: no datasets, no job folders
    live.start_scheduler(**s3)  # on this (web) machine's DATA_DIR
    live.start_worker(gpus=2, DATA_DIR=str(node_dir), **s3)
    client = api_client(alice)
    job_id = client.post("/api/v1/jobs/", SEED_SPEC, content_type="application/yaml").json()["id"]
    # A one-trial sweep beside it: the scheduler registers the best trial's weights, which only the
    # GPU server and the store ever had.
    sweep = client.post("/api/v1/jobs/", SWEEP_SPEC, content_type="application/yaml")
    assert sweep.status_code == 201, sweep.content
    sweep_id = sweep.json()["id"]
    wait_for(lambda: state(job_id) in (JobState.SUCCEEDED, JobState.FAILED), timeout=400, what="the job")
    job = Job.objects.get(pk=job_id)
    assert job.state == JobState.SUCCEEDED, job.error
    # Stored and recorded: the GPU server's own copy of the run folder goes (trial M6).
    wait_for(lambda: not (node_dir / "jobs" / job_id).exists(), timeout=30, what="the GPU server's run folder to go")

    # The dataset came from the store into the node's cache, keyed by the version's manifest hash.
    manifest = job.spec["inputs"]["data"]["sha256"]
    cached = node_dir / "cache" / manifest[:2] / manifest / "dataset"
    assert manifest and (cached / "data.yaml").is_file()
    # ... and training read that copy (the demo's data.yaml names an absolute `path` on this machine):
    # Ultralytics wrote its label cache there.
    assert (cached / "labels" / "train.cache").is_file()
    # The weights went into the store under the job's key; this (web) machine never had them.
    version = ModelVersion.objects.get(job=job)
    assert not artifact_path(job.weights_path).exists()
    store = boto3.client("s3", endpoint_url=moto["url"], aws_access_key_id="testing",
                         aws_secret_access_key="testing", region_name="us-east-1")
    stored = store.get_object(Bucket=moto["bucket"], Key=job.weights_path)["Body"].read()
    assert hashlib.sha256(stored).hexdigest() == version.sha256

    wait_for(lambda: state(sweep_id) in (JobState.SUCCEEDED, JobState.FAILED), timeout=400, what="the sweep")
    trial = Job.objects.get(parent_id=sweep_id)
    assert trial.state == JobState.SUCCEEDED and not artifact_path(trial.weights_path).exists()
    best = ModelVersion.objects.get(name="store-sweep")
    done = JobEvent.objects.get(job_id=sweep_id, kind="succeeded")
    assert f"registered as {best}" in done.message, done.message
    stored = store.get_object(Bucket=moto["bucket"], Key=trial.weights_path)["Body"].read()
    assert (best.job_id, best.weights_key) == (trial.pk, trial.weights_path)
    assert (best.sha256, best.size) == (hashlib.sha256(stored).hexdigest(), len(stored))
    assert best.lineage["sweep"]["id"] == sweep_id
    # The scheduler took them from the store into its own cache, keyed by their hash.
    assert (settings.ARTIFACTS_CACHE_DIR / best.sha256[:2] / best.sha256 / "best.pt").read_bytes() == stored

    settings.ARTIFACTS_CACHE_DIR = tmp_path / "web-cache"
    with override_settings(STORAGES=s3_storages(moto)):
        assert downloaded_sha256(client, job_id) == version.sha256
        response = client.get(f"/api/v1/models/{best.pk}/download/")  # the web serves it from the store
        assert response.status_code == 200
        assert hashlib.sha256(b"".join(response.streaming_content)).hexdigest() == best.sha256
        response.close()

        # The store goes away while the next job trains: it finishes, waits with a reason, no failure.
        stop_moto(moto["process"])
        second = client.post("/api/v1/jobs/", SEED_SPEC.replace("industrial-inspection", "second"),
                             content_type="application/yaml").json()["id"]
        wait_for(lambda: Job.objects.filter(pk=second, reason__startswith="waiting for artifact storage").exists(),
                 timeout=400, what="the job to wait for the storage")
        assert state(second) == JobState.RUNNING
        assert JobEvent.objects.filter(job_id=second, kind="storage_wait").exists()
        assert client.get(f"/api/v1/jobs/{job_id}/weights/").status_code in (200, 503)  # cached here, or 503

        moto["process"] = start_moto(moto["port"], moto["log"])  # back (empty: moto keeps memory only)
        create_bucket(moto["url"], moto["bucket"])
        wait_for(lambda: state(second) in (JobState.SUCCEEDED, JobState.FAILED), timeout=180, what="the upload")
        assert state(second) == JobState.SUCCEEDED
        assert Job.objects.get(pk=second).reason == ""
        assert JobEvent.objects.filter(job_id=second, kind="storage_back").exists()
        weights = Job.objects.get(pk=second).weights_path
        assert store.head_object(Bucket=moto["bucket"], Key=weights)["ContentLength"] > 100_000


def test_a_job_killed_with_its_node_resumes_on_another_node_from_its_stored_checkpoint(live, alice, moto, tmp_path,
                                                                                        settings):
    """Two GPU servers on separate DATA_DIRs, one object store: node A's worker dies after the first
    stored checkpoint (its disk with it); node B fetches that checkpoint and resumes, not restarts."""
    from apps.cluster.models import Node
    from apps.jobs.models import Checkpoint

    from .live import training_processes

    s3 = s3_env(moto)
    pushed = subprocess.run([sys.executable, "manage.py", "artifacts_push"], cwd=settings.BASE_DIR,
                            env=live.env(**s3), capture_output=True, text=True, timeout=600)
    assert pushed.returncode == 0, pushed.stderr
    node_a, node_b = tmp_path / "gpu-server-a", tmp_path / "gpu-server-b"
    live.start_scheduler(**s3)
    live.start_worker(DATA_DIR=str(node_a), **s3)
    client = api_client(alice)
    spec = SEED_SPEC.replace("epochs=2 imgsz=128", "epochs=3 imgsz=64")
    job_id = client.post("/api/v1/jobs/", spec, content_type="application/yaml").json()["id"]

    stored = wait_for(lambda: Checkpoint.objects.filter(job_id=job_id).exclude(key="").first(), timeout=300,
                      what="a first checkpoint in the store")
    assert stored.key.startswith(f"jobs/{job_id}/checkpoints/")
    # Node A trains under its own DATA_DIR: look for its training there (seen alive first, so
    # the wait below for it to die is not vacuous; deleting the disk under a live training
    # races its next checkpoint copy).
    assert training_processes(node_a / "jobs").get(job_id), "node A's training was not found"
    live.kill("worker")  # the worker, its work-horse and (PDEATHSIG) the training: node A is gone
    wait_for(lambda: not training_processes(node_a / "jobs").get(job_id), 10, what="node A's training to die")
    # What reached the store before node A died (on a slow machine a later epoch's row may be
    # recorded without its upload having finished: that one cannot be resumed from).
    in_store = set(Checkpoint.objects.filter(job_id=job_id).exclude(key="").values_list("epoch", flat=True))
    shutil.rmtree(node_a)  # ... and its disk: nothing of node A is readable any more
    wait_for(lambda: Node.objects.get(name="node-a").state == Node.State.LOST, 60, what="node A to be lost")
    live.start_worker("worker2", node="node-b", DATA_DIR=str(node_b), **s3)
    wait_for(lambda: state(job_id) in (JobState.SUCCEEDED, JobState.FAILED), timeout=300, what="the job on node B")

    job = Job.objects.get(pk=job_id)
    assert job.state == JobState.SUCCEEDED, job.error
    assert job.node.name == "node-b" and job.attempt == 2
    resumed = JobEvent.objects.get(job_id=job_id, kind="training_started", attempt=2)
    # Resumed after the newest stored epoch, not from scratch and not from an older one.
    assert int(resumed.data["start_epoch"]) == max(in_store) + 1, (resumed.data, in_store)
    assert JobEvent.objects.filter(job_id=job_id, attempt=2, kind="resuming").exists()
    # Only a checkpoint that never reached the store is passed over, and it is said so.
    for rejected in JobEvent.objects.filter(job_id=job_id, kind="checkpoint_rejected"):
        assert "never reached the artifact store" in rejected.message, rejected.message
    # Node B got the checkpoint (and the run's best.pt, restored before "resuming") from the store:
    # node A's disk no longer exists. Epoch 1 is always Ultralytics' best so far: its stored
    # checkpoint is kept as the run's best.pt.
    assert Checkpoint.objects.filter(job_id=job_id, epoch=1, best=True).exclude(key="").exists()
    # Its results stored and the success recorded, node B's run folder went (trial M6).
    wait_for(lambda: not (node_b / "jobs" / job_id).exists(), timeout=30, what="node B's run folder to go")

    # The weights were uploaded by node B and download through the web from the store.
    version = ModelVersion.objects.get(job=job)
    settings.ARTIFACTS_CACHE_DIR = tmp_path / "web-cache"
    with override_settings(STORAGES=s3_storages(moto)):
        assert downloaded_sha256(client, job_id) == version.sha256

        # Retention: the job succeeded, so its resume checkpoints leave the store at the leading
        # scheduler's next housekeeping run (run here as its chore does); its weights stay.
        from apps.jobs.checkpoint_retention import checkpoints_housekeeping

        store = boto3.client("s3", endpoint_url=moto["url"], aws_access_key_id="testing",
                             aws_secret_access_key="testing", region_name="us-east-1")

        def checkpoints_stored() -> list[str]:
            listing = store.list_objects_v2(Bucket=moto["bucket"], Prefix=f"jobs/{job_id}/checkpoints/")
            return [entry["Key"] for entry in listing.get("Contents", [])]

        # Only the attempts' uploads: the results upload left node B's local copies out.
        assert checkpoints_stored() and all("-attempt-" in key for key in checkpoints_stored())
        assert checkpoints_housekeeping()["jobs"] == 1
        assert checkpoints_stored() == [] and not Checkpoint.objects.filter(job_id=job_id).exists()
        assert downloaded_sha256(client, job_id) == version.sha256
