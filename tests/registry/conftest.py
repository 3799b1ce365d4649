from __future__ import annotations

import os
from pathlib import Path

import pytest

from apps.jobs.models import Job, JobState, MetricPoint
from apps.jobs.services import attempt_finish, job_submit
from apps.jobs.spec import parse_spec
from apps.registry.models import ModelVersion
from tests.security.fast import _fast_password_hashing  # noqa: F401


def build_checkpoint(model_yaml: str, folder: Path, *, names: dict | None = None) -> Path:
    """A real Ultralytics checkpoint, made here: the model built from its YAML and saved (nothing
    downloaded); ``names``: the class names its model carries (as training sets them), else the
    YAML's placeholders."""
    os.environ.setdefault("YOLO_OFFLINE", "1")
    from ultralytics import YOLO

    path = folder / model_yaml.replace(".yaml", ".pt")
    if not path.exists():
        model = YOLO(model_yaml)
        if names is not None:
            model.model.names = names
        model.save(str(path))
    return path


@pytest.fixture(scope="session")
def yolov8n_pt(tmp_path_factory) -> Path:
    return build_checkpoint("yolov8n.yaml", tmp_path_factory.mktemp("weights"))


def trained_checkpoint(folder: Path) -> Path:
    """last.pt of a real one-epoch training on a tiny generated dataset (imgsz 64, CPU)."""
    os.environ.setdefault("YOLO_OFFLINE", "1")
    from ultralytics import YOLO

    from apps.datasets.demo import generate_demo_dataset

    data = generate_demo_dataset(folder / "data", train=8, val=4, imgsz=64)
    model = YOLO("yolov8n.yaml")
    model.train(data=str(data), epochs=1, imgsz=64, batch=4, workers=0, device="cpu", plots=False, val=False,
                project=str(folder), name="run", exist_ok=True, verbose=False)
    return Path(model.trainer.last)


@pytest.fixture
def stores(settings, tmp_path):
    """Job folders, the registry's files and weights under the test's own folder: the settings."""
    settings.JOBS_DIR = tmp_path / "jobs"
    settings.MODELS_DIR = tmp_path / "models"
    settings.WEIGHTS_DIR = tmp_path / "weights"
    return settings


def finish_training(job, content: bytes = b"weights", metrics: dict | None = None, epochs: int = 2) -> ModelVersion:
    """What the worker reports when a training attempt succeeded (the real service path)."""
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING)
    job.refresh_from_db()
    weights = job.run_dir / "train" / "weights" / "best.pt"
    weights.parent.mkdir(parents=True, exist_ok=True)
    weights.write_bytes(content)
    for epoch in range(1, epochs + 1):
        MetricPoint.objects.create(job=job, epoch=epoch, attempt=1, seq=epoch,
                                   values={"metrics/mAP50-95(B)": 0.1 * epoch, "val/box_loss": 2.0 / epoch})
    finished = {"mode": "train", "weights": str(weights), "metrics": metrics or {"metrics/mAP50-95(B)": 0.2},
                "code": {"torch": "2.x", "ultralytics": "8.4"}, "exports": []}
    assert attempt_finish(job, outcome="succeeded", exit_code=0, finished=finished) == "succeeded"
    return ModelVersion.objects.get(job=job)


def train(user, command: str, task_name: str = "pcb") -> Job:
    document = {"task_name": task_name, "command": command, "user": "vision", "allow_duplicate": True,
                "resources": {"gpu": 1}}
    job, _ = job_submit(user=user, spec=parse_spec(document))
    return job
