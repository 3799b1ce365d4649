"""The stress tests' fast trainer keeps the training child's event contract (worker/train_child.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from django.conf import settings


def run_child(tmp_path: Path, *, epochs: int, resume_from: Path | None = None, number: int = 1) -> list[dict]:
    config = {
        "model": "yolov8n.yaml", "data": str(tmp_path / "data.yaml"), "args": {"epochs": epochs},
        "device": "cpu", "project": str(tmp_path / "run"), "name": "train",
        "resume_from": str(resume_from) if resume_from else None, "checkpoint_dir": str(tmp_path / "checkpoints"),
        "events_path": str(tmp_path / f"events-{number}.jsonl"), "config_dir": str(tmp_path / "cfg"),
    }
    path = tmp_path / f"config-{number}.json"
    path.write_text(json.dumps(config))
    result = subprocess.run([sys.executable, "-m", "worker.fast_child", str(path)], cwd=settings.BASE_DIR,
                            env={"PATH": "/usr/bin:/bin", "FAST_TRAINER_EPOCH_S": "0"}, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in Path(config["events_path"]).read_text().splitlines()]


def test_it_reports_each_epoch_before_its_checkpoint_and_finishes_with_weights(tmp_path):
    events = run_child(tmp_path, epochs=3)
    kinds = [e["type"] for e in events if e["type"] != "progress"]
    assert kinds == ["started", "epoch", "checkpoint", "epoch", "checkpoint", "epoch", "checkpoint", "finished"]
    checkpoint = next(e for e in reversed(events) if e["type"] == "checkpoint")
    assert Path(checkpoint["path"]).stat().st_size == checkpoint["size"]
    assert Path(events[-1]["weights"]).is_file()


def test_it_resumes_after_the_checkpoints_epoch(tmp_path):
    first = run_child(tmp_path, epochs=2)
    checkpoint = Path([e for e in first if e["type"] == "checkpoint"][0]["path"])  # epoch 1
    resumed = run_child(tmp_path, epochs=3, resume_from=checkpoint, number=2)
    assert resumed[0] == {**resumed[0], "type": "started", "start_epoch": 2}
    assert [e["epoch"] for e in resumed if e["type"] == "epoch"] == [2, 3]


def test_it_never_imports_torch_or_ultralytics():
    probe = "import sys, worker.fast_child; print(sorted(m for m in sys.modules if m in ('torch', 'ultralytics')))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=settings.BASE_DIR, capture_output=True, text=True,
                         check=True, env={"PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == "[]"
