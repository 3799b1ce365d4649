"""A real predict job stores a log: a line per annotated image (Ultralytics, called with
``verbose=False``, printed nothing, and a new user found a predict job with no log at all)."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from apps.jobs.models import Job, JobState, LogChunk
from apps.registry.models import PredictionRun
from tests.conftest import api_client
from tests.registry.conftest import build_checkpoint

from .live import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
TERMINAL = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMED_OUT)


def test_a_predict_job_logs_each_image_it_annotates(live, bob, demo_registered, tmp_path):
    client = api_client(bob)
    weights = build_checkpoint("yolov8n.yaml", tmp_path)
    upload = SimpleUploadedFile("yolov8n.pt", weights.read_bytes(), content_type="application/octet-stream")
    response = client.post("/api/v1/weights/", {"file": upload, "team": "vision"}, format="multipart")
    assert response.status_code == 201, response.content
    response = client.post("/api/v1/jobs/", {
        "task_name": "predict", "command": "yolo predict model=yolov8n:v1 source=demo split=val imgsz=64",
        "user": "vision", "resources": {"gpu": 1, "cpu": "1", "memory": "2Gi"}, "timeout": 600}, format="json")
    assert response.status_code == 201, response.content
    live.start_scheduler()
    live.start_worker()

    job = wait_for(lambda: (j := Job.objects.get(pk=response.json()["id"])).state in TERMINAL and j, timeout=300,
                   interval=0.5, what="the predict job to finish")
    assert job.state == JobState.SUCCEEDED, job.error
    images = PredictionRun.objects.get(job=job).images
    log = "".join(LogChunk.objects.filter(job=job).order_by("seq").values_list("text", flat=True))
    assert f"predict: {images} images with " in log
    for n in range(1, images + 1):
        assert f"image {n}/{images} " in log
    assert f"{images} images annotated" in log
    assert client.get(f"/api/v1/jobs/{job.pk}/logs/").json()["results"]  # what the page and `yoloq logs` read
