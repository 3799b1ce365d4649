"""Weights uploaded through the web with an object store (a real moto_server): in the store,
with the recorded sha256, before the upload answers; while the store is down a 503 naming the
file and no version, no file, no charge."""

from __future__ import annotations

import hashlib

import boto3
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import override_settings

from apps.accounts.models import StorageCharge
from apps.registry.models import ModelVersion
from tests.conftest import api_client
from tests.s3 import s3_storages, stop_moto

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


@pytest.fixture(autouse=True)
def web_disk(settings, tmp_path):
    settings.MODELS_DIR = tmp_path / "web" / "models"
    return settings.MODELS_DIR


def push(user, path):
    upload = SimpleUploadedFile("yolov8s.pt", path.read_bytes(), content_type="application/octet-stream")
    return api_client(user).post("/api/v1/weights/", {"file": upload, "team": "vision"}, format="multipart")


def test_uploaded_weights_are_in_the_store_when_the_upload_answers(bob, moto, yolov8n_pt):
    with override_settings(STORAGES=s3_storages(moto)):
        response = push(bob, yolov8n_pt)
        assert response.status_code == 201, response.content
    version = ModelVersion.objects.get()
    store = boto3.client("s3", endpoint_url=moto["url"], aws_access_key_id="testing",
                         aws_secret_access_key="testing", region_name="us-east-1")
    stored = store.get_object(Bucket=moto["bucket"], Key=version.weights_key)["Body"].read()
    assert hashlib.sha256(stored).hexdigest() == version.sha256 == hashlib.sha256(yolov8n_pt.read_bytes()).hexdigest()


def test_while_the_store_is_down_a_weights_upload_is_a_503_and_leaves_no_version(bob, moto, yolov8n_pt, web_disk):
    with override_settings(STORAGES=s3_storages(moto)):
        stop_moto(moto["process"])
        response = push(bob, yolov8n_pt)
        assert response.status_code == 503
        assert "artifact storage" in response.json()["file"][0]
    assert not ModelVersion.objects.exists()
    assert not StorageCharge.objects.exists()
    assert not any(p.is_file() for p in web_disk.rglob("*"))


def test_shared_weights_an_operator_adds_are_in_the_store_and_a_web_machine_without_them_takes_jobs_on_them(
        bob, node, demo_registered, moto, yolov8n_pt, settings, tmp_path):
    """`manage.py weights add --shared` on one machine; another (its own WEIGHTS_DIR, never had the
    file) accepts `model=base.pt` with the row's sha256, which a GPU server then fetches by."""
    import io

    from django.core.management import call_command

    from apps.core.storage import artifact_local
    from apps.jobs.models import Job
    from apps.registry.models import SharedWeights

    settings.WEIGHTS_DIR = tmp_path / "operator" / "weights"
    with override_settings(STORAGES=s3_storages(moto)):
        call_command("weights", "add", str(yolov8n_pt), "--shared", "--name", "base.pt", stdout=io.StringIO())
    row = SharedWeights.objects.get(filename="base.pt")
    machine_b = tmp_path / "web-b" / "weights"  # another machine
    with override_settings(STORAGES=s3_storages(moto), WEIGHTS_DIR=machine_b,
                           ARTIFACTS_CACHE_DIR=tmp_path / "gpu-server" / "cache"):
        spec = ("task_name: from-base\ncommand: yolo train data=demo model=base.pt epochs=1 imgsz=64\n"
                "resources: {gpu: 1}\nuser: vision\n")
        response = api_client(bob).post("/api/v1/jobs/", spec, content_type="application/yaml")
        assert response.status_code == 201, response.content
        model = Job.objects.get(pk=response.json()["id"]).spec["inputs"]["model"]
        assert model["sha256"] == row.sha256 == hashlib.sha256(yolov8n_pt.read_bytes()).hexdigest()
        assert artifact_local(row.key, row.sha256).read_bytes() == yolov8n_pt.read_bytes()  # what a node fetches
        assert not machine_b.exists()

        stop_moto(moto["process"])  # the store down: nothing is added, the command says why
        with pytest.raises(Exception, match="not stored"):
            call_command("weights", "add", str(yolov8n_pt), "--shared", "--name", "other.pt", stdout=io.StringIO())
        assert not SharedWeights.objects.filter(filename="other.pt").exists()



def test_an_export_made_on_a_gpu_server_downloads_through_the_web_from_the_store(bob, demo_registered, moto,
                                                                                 settings, tmp_path):
    """The GPU server's job folder went into the store before the success was recorded; the
    export's row names that key, and the web (which never had the file) serves it, checked."""
    import shutil

    from apps.core.artifacts import artifact_key
    from apps.core.storage import artifact_upload
    from apps.jobs.models import Job, JobState
    from apps.jobs.services import attempt_finish
    from apps.registry.models import Export

    from .test_lineage import train

    settings.JOBS_DIR = tmp_path / "gpu-server" / "jobs"
    settings.ARTIFACTS_CACHE_DIR = tmp_path / "web" / "cache"
    job = train(bob, "yolo train data=demo model=yolov8n.yaml epochs=1")
    weights = job.run_dir / "train" / "weights"
    weights.mkdir(parents=True)
    (weights / "best.pt").write_bytes(b"weights")
    (weights / "best.onnx").write_bytes(b"onnx bytes")
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING)
    job.refresh_from_db()
    finished = {"mode": "train", "weights": str(weights / "best.pt"), "metrics": {},
                "exports": [{"format": "onnx", "path": str(weights / "best.onnx"), "verification": {"passed": True}}]}
    with override_settings(STORAGES=s3_storages(moto)):
        for path in weights.iterdir():  # what worker.artifacts.results_upload does before the success
            artifact_upload(artifact_key(path), path)
        assert attempt_finish(job, outcome="succeeded", exit_code=0, finished=finished) == "succeeded"
        export = Export.objects.get()
        assert export.key == f"jobs/{job.pk}/train/weights/best.onnx"
        shutil.rmtree(tmp_path / "gpu-server")  # the web machine has none of the node's files
        response = api_client(bob).get(f"/api/v1/exports/{export.pk}/download/")
        assert response.status_code == 200, response.content
        assert b"".join(response.streaming_content) == b"onnx bytes"
        response.close()


def test_deleted_uploaded_weights_leave_the_store_too(bob, moto, yolov8n_pt):
    from apps.registry.services import model_version_delete

    with override_settings(STORAGES=s3_storages(moto)):
        assert push(bob, yolov8n_pt).status_code == 201
        version = ModelVersion.objects.get()
        store = boto3.client("s3", endpoint_url=moto["url"], aws_access_key_id="testing",
                             aws_secret_access_key="testing", region_name="us-east-1")
        assert store.list_objects_v2(Bucket=moto["bucket"])["KeyCount"] == 1
        model_version_delete(version=version, by=bob)
        assert store.list_objects_v2(Bucket=moto["bucket"])["KeyCount"] == 0


@pytest.mark.parametrize("recorded", [True, False])
def test_weights_from_the_store_download_in_ranges(bob, moto, yolov8n_pt, recorded, settings, tmp_path):
    """With a recorded sha256 the range comes out of this web node's checked cache; without one
    (older rows) out of the store itself, StoredObjectReader fetching from the range's start."""
    settings.ARTIFACTS_CACHE_DIR = tmp_path / "web" / "cache"
    data = yolov8n_pt.read_bytes()
    with override_settings(STORAGES=s3_storages(moto)):
        assert push(bob, yolov8n_pt).status_code == 201
        version = ModelVersion.objects.get()
        if not recorded:
            ModelVersion.objects.filter(pk=version.pk).update(sha256="")
        response = api_client(bob).get(f"/api/v1/models/{version.pk}/download/", HTTP_RANGE="bytes=1000-1999")
        assert response.status_code == 206, response
        assert response["Content-Range"] == f"bytes 1000-1999/{len(data)}"
        assert b"".join(response.streaming_content) == data[1000:2000]
        tail = api_client(bob).get(f"/api/v1/models/{version.pk}/download/", HTTP_RANGE="bytes=-100")
        assert tail.status_code == 206 and b"".join(tail.streaming_content) == data[-100:]
        past = api_client(bob).get(f"/api/v1/models/{version.pk}/download/", HTTP_RANGE=f"bytes={len(data)}-")
        assert past.status_code == 416 and f"{len(data)} bytes" in past.json()["Range"][0]
