"""Classification end to end with real parts: a train/<class>/ folder uploaded through the API, a
classify job run by the real scheduler and gpu_worker (Ultralytics on the CPU, imgsz 32), its
top-1/top-5 accuracy per epoch, checkpoints, the registered version, and a val, a predict and an
export job of that version."""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path

import pytest

from apps.jobs.models import Checkpoint, Job, JobState
from apps.registry.models import Evaluation, Export, ModelVersion
from tests.conftest import api_client

from .live import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
TERMINAL = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMED_OUT)


def zipped(folder: Path) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                archive.write(path, path.relative_to(folder.parent).as_posix())  # one top folder, as a zip tool writes
    return buffer.getvalue()


def submit(client, command: str, name: str, **more) -> str:
    spec = {"task_name": name, "command": command, "resources": {"gpu": 1, "cpu": "1", "memory": "4Gi"},
            "user": "vision", **more}
    response = client.post("/api/v1/jobs/", spec, format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def finished(job_id: str) -> Job:
    wait_for(lambda: Job.objects.get(pk=job_id).state in TERMINAL, timeout=400, interval=0.5,
             what=f"job {job_id} to finish")
    return Job.objects.get(pk=job_id)


def test_a_classify_job_trains_to_success_with_accuracy_per_epoch_and_a_registered_version(live, alice, tmp_path):
    from django.core.files.uploadedfile import SimpleUploadedFile

    os.environ.setdefault("YOLO_OFFLINE", "1")
    from apps.datasets.demo import generate_demo_classification_dataset

    folder = generate_demo_classification_dataset(tmp_path / "shapescls", train=6, val=2, imgsz=32)
    client = api_client(alice)
    upload = SimpleUploadedFile("shapescls.zip", zipped(folder), content_type="application/zip")
    dataset = client.post("/api/v1/datasets/", {"file": upload, "name": "shapescls", "team": "vision"},
                          format="multipart")
    assert dataset.status_code == 201, dataset.content
    assert (dataset.json()["kind"], dataset.json()["names"]) == ("classify", ["circle", "rectangle", "triangle"])

    live.start_scheduler()
    live.start_worker()
    job_id = submit(client, "yolo classify train data=shapescls model=yolov8n-cls.yaml epochs=2 imgsz=32 batch=6 "
                            "seed=1", "shapes-cls", export=["torchscript"])
    job = finished(job_id)
    assert job.state == JobState.SUCCEEDED, job.error
    # The export after training, verified on the training's classification dataset like an export job.
    (after,) = Export.objects.filter(job_id=job_id)
    assert after.format == "torchscript" and after.verification["passed"]
    assert after.verification["compared"] == "class probabilities"

    metrics = client.get(f"/api/v1/jobs/{job_id}/metrics/").json()["results"]
    assert [m["epoch"] for m in metrics] == [1, 2]
    for point in metrics:
        assert {"train/loss", "metrics/accuracy_top1", "metrics/accuracy_top5"} <= set(point["values"])
        assert 0.0 <= point["values"]["metrics/accuracy_top1"] <= point["values"]["metrics/accuracy_top5"] <= 1.0
    assert Checkpoint.objects.filter(job_id=job_id).exists(), "each epoch's checkpoint is kept for a resume"

    version = ModelVersion.objects.get(job_id=job_id)
    assert version.task == "classify" and version.dataset.reference == "shapescls:v1"
    assert "metrics/accuracy_top1" in version.metrics and "metrics/mAP50-95(B)" not in version.metrics
    assert version.class_names == ["circle", "rectangle", "triangle"]

    # Val of the registered classifier on the same dataset: Ultralytics reads the folder here too.
    val_id = submit(client, f"yolo val model={version.name}:v{version.version} data=shapescls imgsz=32",
                    "shapes-cls-val")
    val = finished(val_id)
    assert val.state == JobState.SUCCEEDED, val.error
    evaluation = Evaluation.objects.get(job_id=val_id)
    assert 0.0 <= evaluation.metrics["metrics/accuracy_top1"] <= 1.0
    # Each class's row from Ultralytics' confusion matrix: its two val images, their top-1 accuracy.
    assert [(row["name"], row["of"], row["images"]) for row in evaluation.per_class] == [
        ("circle", "top1", 2), ("rectangle", "top1", 2), ("triangle", "top1", 2)]
    assert sum(row["correct"] for row in evaluation.per_class) / 6 == pytest.approx(
        evaluation.metrics["metrics/accuracy_top1"])
    assert client.get(f"/api/v1/jobs/{val_id}/").json()["outcome"]["evaluation"]["classes"] == 3  # yoloq status's

    # Predict with it on the val split: each image's top-5 classes, no boxes.
    predict_id = submit(client, f"yolo predict model={version.name}:v{version.version} source=shapescls split=val "
                                "imgsz=32", "shapes-cls-predict")
    predict = finished(predict_id)
    assert predict.state == JobState.SUCCEEDED, predict.error
    assert client.get(f"/api/v1/jobs/{predict_id}/").json()["outcome"]["predictions"]["classified"] is True
    results = client.get(f"/api/v1/jobs/{predict_id}/predictions/").json()["results"]
    assert len(results) == 6 and all(item["boxes"] == [] for item in results)
    for item in results:
        assert sorted(c["name"] for c in item["top5"]) == version.class_names  # all three classes, ranked
        assert item["top5"][0]["conf"] >= item["top5"][-1]["conf"]

    # Export it without data=: verified on the dataset it was trained on (its val images), class
    # probabilities and top-1 against the PyTorch model.
    export_id = submit(client, f"yolo export model={version.name}:v{version.version} format=onnx imgsz=32",
                       "shapes-cls-export")
    export = finished(export_id)
    assert export.state == JobState.SUCCEEDED, export.error
    check = Export.objects.get(job_id=export_id).verification
    assert check["passed"] and check["compared"] == "class probabilities" and check["outputs"] == [[1, 3]]
    assert check["top1_same"] + check["top1_ties"] == check["images"] == 4


def test_a_classify_sweep_without_a_metric_ranks_its_trials_by_top1_and_registers_the_best(live, alice, tmp_path):
    """Its default metric was box mAP50-95, which no classify trial reports: refused at submit since
    trial21, and before that every trial ran and none was ranked."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    os.environ.setdefault("YOLO_OFFLINE", "1")
    from apps.datasets.demo import generate_demo_classification_dataset
    from apps.sweeps.models import Trial

    folder = generate_demo_classification_dataset(tmp_path / "shapescls", train=4, val=2, imgsz=32)
    client = api_client(alice)
    upload = SimpleUploadedFile("shapescls.zip", zipped(folder), content_type="application/zip")
    assert client.post("/api/v1/datasets/", {"file": upload, "name": "shapescls", "team": "vision"},
                       format="multipart").status_code == 201
    spec = {"task_name": "cls-sweep", "user": "vision", "resources": {"gpu": 1, "cpu": "1", "memory": "4Gi"},
            "command": "yolo classify train data=shapescls model=yolov8n-cls.yaml epochs=1 imgsz=32 batch=6 "
                       "optimizer=SGD",
            "sweep": {"method": "grid", "parameters": {"lr0": [0.01, 0.02]}, "parallel": 2}}
    response = client.post("/api/v1/jobs/", spec, format="json")
    assert response.status_code == 201, response.content
    parent = response.json()["id"]
    assert Job.objects.get(pk=parent).spec["sweep"]["metric"] == "metrics/accuracy_top1"

    live.start_scheduler()
    live.start_worker()
    assert finished(parent).state == JobState.SUCCEEDED
    assert all(t.value is not None for t in Trial.objects.filter(sweep_id=parent)), "every trial was ranked"
    version = ModelVersion.objects.get(name="cls-sweep")
    assert version.task == "classify" and version.lineage["sweep"]["metric"] == "metrics/accuracy_top1"
    assert version.lineage["sweep"]["value"] == version.metrics["metrics/accuracy_top1"]
