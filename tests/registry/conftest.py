from __future__ import annotations

import os
from pathlib import Path

import pytest

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
