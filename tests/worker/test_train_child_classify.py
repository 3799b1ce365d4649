"""The training child on a classify model, as the GPU worker runs it: a real subprocess, real
Ultralytics on the CPU (imgsz 32), the network blocked and $HOME empty. Ultralytics is given the
dataset's folder (a classification dataset is read only as one), reports top-1/top-5 accuracy
every epoch, keeps a checkpoint per epoch and resumes from one."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from apps.datasets.demo import CLASS_NAMES, generate_demo_classification_dataset
from worker.train_child import EXIT_OK

from .test_train_child import TRAIN_TIMEOUT_S, Sandbox, _kill_group, assert_clean_sandbox, events_of, of_type

pytestmark = pytest.mark.integration


def classification_data(root: Path) -> Path:
    """The demo classification folder with the data.yaml an upload stores beside its splits."""
    folder = generate_demo_classification_dataset(root, train=4, val=2, imgsz=32)
    names = dict(enumerate(sorted(CLASS_NAMES.values())))
    (folder / "data.yaml").write_text(yaml.safe_dump({"train": "train", "val": "val", "names": names}))
    return folder / "data.yaml"


def test_a_classify_model_trains_on_the_folder_and_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    box = Sandbox(tmp_path, classification_data(tmp_path / "pets"))
    first_run = json_args(box.config(epochs=3, batch=6, model="yolov8n-cls.yaml", task="classify"), imgsz=32)
    proc = box.start(first_run)
    try:
        deadline = time.monotonic() + TRAIN_TIMEOUT_S
        while not of_type(events_of(first_run), "checkpoint"):
            assert proc.poll() is None, "child exited before its first checkpoint: " + proc.stdout.read().decode()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint in time"
            time.sleep(0.05)
    finally:
        _kill_group(proc)
    first_events = events_of(first_run)
    epoch = of_type(first_events, "epoch")[0]
    assert epoch["epoch"] == 1
    assert {"metrics/accuracy_top1", "metrics/accuracy_top5", "train/loss"} <= set(epoch["values"])

    checkpoint = Path(of_type(first_events, "checkpoint")[0]["path"])
    second = json_args(box.config(epochs=3, batch=6, model="yolov8n-cls.yaml", task="classify",
                                  resume_from=checkpoint), imgsz=32)
    code, output = box.run(second)
    assert code == EXIT_OK, output[-4000:]
    events = events_of(second)
    assert events[0]["start_epoch"] == 2 and [e["epoch"] for e in of_type(events, "epoch")] == [2, 3]
    finished = events[-1]
    assert finished["type"] == "finished" and Path(finished["weights"]).is_file()
    assert 0.0 <= finished["metrics"]["metrics/accuracy_top1"] <= 1.0
    assert not any(key.startswith("metrics/mAP") for key in finished["metrics"])
    assert_clean_sandbox(box)


def json_args(config: Path, **args) -> Path:
    """The config with these training arguments changed (the sandbox's defaults are detect's imgsz 128)."""
    document = json.loads(config.read_text())
    document["args"].update(args)
    config.write_text(json.dumps(document))
    return config
