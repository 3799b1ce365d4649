"""A dataset uploaded through the web with an object store (a real moto_server): its files are
in the store before the upload answers, complete enough that a GPU server without the web's
DATA_DIR fetches the version and finds its manifest hash; while the store is down the upload is
a 503 naming the file and leaves no version behind."""

from __future__ import annotations

import pytest
from django.test import override_settings

from apps.accounts.models import StorageCharge
from apps.datasets.models import Dataset
from apps.jobs.models import Job
from tests.conftest import api_client
from tests.s3 import s3_storages, stop_moto
from worker.artifacts import _listing, dataset_local

from .archives import make_zip, upload, valid_files

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


@pytest.fixture(autouse=True)
def web_disk(settings, tmp_path):
    settings.DATASETS_DIR = tmp_path / "web" / "datasets"
    settings.ARTIFACTS_CACHE_DIR = tmp_path / "gpu-server" / "cache"
    return settings.DATASETS_DIR


def post(user):
    return api_client(user).post("/api/v1/datasets/", {"file": upload(make_zip(valid_files())), "name": "pcb",
                                                       "team": "vision"}, format="multipart")


def test_an_uploaded_dataset_is_in_the_store_when_the_upload_answers(bob, moto, web_disk):
    with override_settings(STORAGES=s3_storages(moto)):
        response = post(bob)
        assert response.status_code == 201, response.content
        dataset = Dataset.objects.get()
        keys = _listing(dataset.key)
        assert "datasets/vision/pcb/v1/data.yaml" in keys and "datasets/vision/pcb/v1/labels/val/1.txt" in keys
        # A GPU server fetches it from the store alone and finds the hash recorded at upload.
        local = dataset_local(dataset.yaml_key, dataset.sha256)
        assert local.is_file() and not local.is_relative_to(web_disk)


def test_while_the_store_is_down_an_upload_is_a_503_and_leaves_no_version(bob, moto, web_disk):
    with override_settings(STORAGES=s3_storages(moto)):
        stop_moto(moto["process"])
        response = post(bob)
        assert response.status_code == 503
        assert "artifact storage" in response.json()["file"][0]
        assert not Dataset.objects.exists()
        assert not StorageCharge.objects.exists()
        assert not any(p.is_file() for p in web_disk.rglob("*"))


def test_a_web_machine_without_the_files_takes_jobs_on_it_and_shows_its_samples_from_the_store(
        bob, node, moto, web_disk, tmp_path):
    """Web machine A received the upload; web machine B (its own DATA_DIR, never had the files)
    accepts a job on the version and serves its sample thumbnails, read from the store."""
    from .archives import PNG

    with override_settings(STORAGES=s3_storages(moto)):
        assert post(bob).status_code == 201
        dataset = Dataset.objects.get()
        assert dataset.stats["samples"]
    machine_b = tmp_path / "web-b" / "datasets"
    with override_settings(STORAGES=s3_storages(moto), DATASETS_DIR=machine_b):
        client = api_client(bob)
        spec = ("task_name: on-b\ncommand: yolo train data=pcb model=yolov8n.yaml epochs=1 imgsz=64\n"
                "resources: {gpu: 1}\nuser: vision\n")
        response = client.post("/api/v1/jobs/", spec, content_type="application/yaml")
        assert response.status_code == 201, response.content
        assert Job.objects.get(pk=response.json()["id"]).spec["inputs"]["data"]["sha256"] == dataset.sha256
        sample = client.get(f"/api/v1/datasets/{dataset.pk}/samples/0/")
        assert sample.status_code == 200 and sample["Content-Type"] == "image/png"
        assert b"".join(sample.streaming_content) == PNG
        assert client.get(f"/api/v1/datasets/{dataset.pk}/samples/99/").status_code == 404
        assert not machine_b.exists()  # nothing of it was read from (or put on) B's disk
        stop_moto(moto["process"])  # the store down: the thumbnail is a 503 saying so, not a 500
        down = client.get(f"/api/v1/datasets/{dataset.pk}/samples/0/")
        assert down.status_code == 503 and "artifact storage" in str(down.json()), down.content


def test_a_deleted_version_leaves_the_store_too(bob, moto, web_disk, tmp_path):
    """Deleted on a web machine that never had the files: its objects go all the same."""
    from apps.datasets.services import dataset_delete

    with override_settings(STORAGES=s3_storages(moto)):
        assert post(bob).status_code == 201
        dataset = Dataset.objects.get()
        assert len(_listing(dataset.key)) == 9
    with override_settings(STORAGES=s3_storages(moto), DATASETS_DIR=tmp_path / "web-b" / "datasets"):
        dataset_delete(dataset=dataset, by=bob)
        assert _listing(dataset.key) == []
