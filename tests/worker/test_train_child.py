"""The training child and the demo dataset, without Django.

The integration tests run ``python -m worker.train_child`` as a real subprocess with
real Ultralytics on the CPU (about 6 s per training run), with the network blocked and
$HOME pointed at an empty directory, and check the event contract the GPU worker
relies on.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from apps.core.hashing import file_sha256
from apps.datasets.demo import generate_demo_dataset
from worker.train_child import (
    EXIT_CHECKPOINT,
    EXIT_CONFIG,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_STOPPED,
    classify_error,
    copy_checkpoint,
    json_safe,
    prune_checkpoints,
    run,
)

REPO = Path(__file__).resolve().parents[2]
TRAIN_TIMEOUT_S = 300

# Installed first on the child's sys.path: every attempt to resolve a host name or open
# an IP connection is recorded and refused, so "offline-safe" is checked, not assumed.
NETWORK_GUARD = textwrap.dedent(
    """
    import os, socket

    _log = os.environ["NETWORK_GUARD_LOG"]

    def _refuse(what):
        with open(_log, "a") as f:
            f.write(what + "\\n")
        raise OSError("network disabled in tests: " + what)

    def _getaddrinfo(host, *args, **kwargs):
        _refuse(f"getaddrinfo {host}")

    _connect = socket.socket.connect

    def _guarded_connect(self, address):
        if self.family == socket.AF_UNIX:
            return _connect(self, address)
        _refuse(f"connect {address}")

    socket.getaddrinfo = _getaddrinfo
    socket.socket.connect = _guarded_connect
    """
)


# ---------------------------------------------------------------------------- helpers


class Sandbox:
    """Paths and environment for one job's child runs."""

    def __init__(self, root: Path, data: Path) -> None:
        self.root = root
        self.data = data
        self.home = root / "home"
        self.guard = root / "guard"
        self.network_log = root / "network.log"
        self.home.mkdir(parents=True)
        self.guard.mkdir()
        (self.guard / "sitecustomize.py").write_text(NETWORK_GUARD)
        self.network_log.touch()
        self.runs = 0

    def config(self, *, epochs: int, resume_from: Path | None = None, batch: int = 8, **extra: Any) -> Path:
        self.runs += 1
        config = {
            "model": "yolov8n.yaml",
            "data": str(self.data),
            "args": {"epochs": epochs, "imgsz": 128, "batch": batch, "workers": 0, "seed": 0},
            "device": "cpu",
            "project": str(self.root / "runs"),
            "name": "job-1",
            "resume_from": str(resume_from) if resume_from else None,
            "checkpoint_dir": str(self.root / "checkpoints"),
            "events_path": str(self.root / f"events-{self.runs}.jsonl"),
            "progress_interval_s": 0.25,
            "config_dir": str(self.root / "yolo-config"),
            **extra,
        }
        path = self.root / f"config-{self.runs}.json"
        path.write_text(json.dumps(config))
        return path

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "YOLO_", "ULTRALYTICS_"))}
        # Ultralytics treats PYTEST_CURRENT_TEST as "tests running" and changes behaviour.
        env.update(
            HOME=str(self.home),
            PYTHONPATH=str(self.guard),
            NETWORK_GUARD_LOG=str(self.network_log),
        )
        env.pop("XDG_CONFIG_HOME", None)
        env.pop("MPLCONFIGDIR", None)
        return env

    def start(self, config: Path) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "worker.train_child", str(config)],
            cwd=REPO,
            env=self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group, as the GPU worker runs it
        )

    def run(self, config: Path) -> tuple[int, str]:
        proc = self.start(config)
        try:
            out, _ = proc.communicate(timeout=TRAIN_TIMEOUT_S)
        finally:
            _kill_group(proc)
        return proc.returncode, out.decode(errors="replace")


def events_of(config: Path) -> list[dict[str, Any]]:
    path = Path(json.loads(config.read_text())["events_path"])
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def of_type(events: list[dict[str, Any]], type_: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == type_]


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def assert_clean_sandbox(box: Sandbox) -> None:
    assert box.network_log.read_text() == "", "the child tried to use the network"
    assert list(box.home.iterdir()) == [], "the child wrote into $HOME"


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One finished 2-epoch run, shared by the tests that only read its results."""
    root = tmp_path_factory.mktemp("trained")
    box = Sandbox(root, generate_demo_dataset(root / "demo"))
    config = box.config(epochs=2)
    code, output = box.run(config)
    return {"box": box, "config": config, "code": code, "output": output, "events": events_of(config)}


# ----------------------------------------------------------------------- demo dataset


def test_demo_dataset_is_deterministic_for_a_seed(tmp_path: Path) -> None:
    """Same seed, same bytes; another seed, other images."""
    a = generate_demo_dataset(tmp_path / "a", seed=3).parent
    b = generate_demo_dataset(tmp_path / "b", seed=3).parent
    c = generate_demo_dataset(tmp_path / "c", seed=4).parent
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.suffix in {".jpg", ".txt"})
    assert len(files) == 2 * (32 + 8)
    for rel in files:
        assert (a / rel).read_bytes() == (b / rel).read_bytes()
    assert any((a / rel).read_bytes() != (c / rel).read_bytes() for rel in files)


def test_demo_dataset_writes_yolo_labels_and_a_safe_data_yaml(tmp_path: Path) -> None:
    """1-3 normalised boxes per image, 3 classes, absolute path, no download key."""
    data_yaml = generate_demo_dataset(tmp_path / "demo", train=6, val=2, imgsz=96)
    data = yaml.safe_load(data_yaml.read_text())
    assert data == {
        "path": str((tmp_path / "demo").resolve()),
        "train": "images/train",
        "val": "images/val",
        "names": {0: "rectangle", 1: "circle", 2: "triangle"},
    }
    for split, count in (("train", 6), ("val", 2)):
        images = sorted((tmp_path / "demo/images" / split).glob("*.jpg"))
        labels = sorted((tmp_path / "demo/labels" / split).glob("*.txt"))
        assert len(images) == len(labels) == count
        assert [p.stem for p in images] == [p.stem for p in labels]
        for label in labels:
            rows = [line.split() for line in label.read_text().splitlines()]
            assert 1 <= len(rows) <= 3
            for cls, *box in rows:
                assert cls in {"0", "1", "2"}
                cx, cy, w, h = map(float, box)
                assert 0 < w <= 1 and 0 < h <= 1
                # Inside the image, up to the 6-decimal rounding of the label text.
                assert cx - w / 2 >= -1e-6 and cx + w / 2 <= 1 + 1e-6
                assert cy - h / 2 >= -1e-6 and cy + h / 2 <= 1 + 1e-6


def test_demo_dataset_second_call_returns_the_existing_dataset(tmp_path: Path) -> None:
    """Idempotent: nothing is rewritten for the same parameters."""
    data_yaml = generate_demo_dataset(tmp_path / "demo")
    stamp = data_yaml.stat().st_mtime_ns
    started = time.monotonic()
    assert generate_demo_dataset(tmp_path / "demo") == data_yaml
    assert time.monotonic() - started < 0.5
    assert data_yaml.stat().st_mtime_ns == stamp


def test_demo_dataset_is_rebuilt_for_other_parameters(tmp_path: Path) -> None:
    """Other parameters replace the old demo dataset, leaving no temp folders behind."""
    generate_demo_dataset(tmp_path / "demo", train=4, val=2)
    generate_demo_dataset(tmp_path / "demo", train=5, val=2)
    assert len(list((tmp_path / "demo/images/train").glob("*.jpg"))) == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo"]


def test_demo_dataset_refuses_to_replace_a_foreign_directory(tmp_path: Path) -> None:
    """A non-empty folder that is not a demo dataset is left alone."""
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo/keep.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        generate_demo_dataset(tmp_path / "demo")
    assert (tmp_path / "demo/keep.txt").read_text() == "mine"


# -------------------------------------------------------------------------- unit bits


def test_copy_checkpoint_writes_the_file_then_a_matching_sidecar(tmp_path: Path) -> None:
    """The copy, its sha256 and its sidecar agree; no temp files remain."""
    source = tmp_path / "last.pt"
    source.write_bytes(os.urandom(3 << 20))
    info = copy_checkpoint(source, tmp_path / "ckpt", 7)
    assert info.path == tmp_path / "ckpt/epoch-0007.pt"
    assert info.path.read_bytes() == source.read_bytes()
    assert info.sha256 == file_sha256(source) and info.size == 3 << 20
    sidecar = json.loads((tmp_path / "ckpt/epoch-0007.json").read_text())
    assert sidecar == {"epoch": 7, "sha256": info.sha256, "size": info.size}
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["epoch-0007.json", "epoch-0007.pt"]


def test_prune_checkpoints_keeps_the_newest_three(tmp_path: Path) -> None:
    """Older checkpoints and their sidecars go; unrelated files stay."""
    source = tmp_path / "last.pt"
    source.write_bytes(b"x")
    for epoch in (1, 2, 3, 10, 11):
        copy_checkpoint(source, tmp_path / "ckpt", epoch)
    (tmp_path / "ckpt/notes.txt").write_text("keep")
    prune_checkpoints(tmp_path / "ckpt")
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "epoch-0003.json",
        "epoch-0003.pt",
        "epoch-0010.json",
        "epoch-0010.pt",
        "epoch-0011.json",
        "epoch-0011.pt",
        "notes.txt",
    ]


def test_json_safe_turns_nan_and_inf_into_null() -> None:
    """Events are strict JSON."""
    assert json_safe({"a": float("nan"), "b": [float("inf"), 1.5], "c": 2}) == {"a": None, "b": [None, 1.5], "c": 2}


def test_cuda_out_of_memory_is_classified_as_oom() -> None:
    """The message torch uses is enough, wrapped or not."""
    try:
        try:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        except RuntimeError as e:
            raise RuntimeError("training failed") from e
    except RuntimeError as e:
        kind, advice = classify_error(e)
    assert kind == "oom"
    assert "batch" in advice


@pytest.mark.parametrize("model", ["yolov8n.pt", "yolov8n", "weights/best.pt"])
def test_a_model_that_would_be_downloaded_is_a_config_error(tmp_path: Path, model: str) -> None:
    """Only model YAMLs and absolute .pt paths are accepted; exit 2, kind 'config'."""
    box = Sandbox(tmp_path, tmp_path / "data.yaml")
    config = box.config(epochs=1)
    config.write_text(json.dumps({**json.loads(config.read_text()), "model": model}))
    assert run(config) == EXIT_CONFIG
    (error,) = events_of(config)
    assert error["type"] == "error" and error["kind"] == "config" and "model" in error["message"]


# ------------------------------------------------------------------------ integration


@pytest.mark.integration
def test_it_trains_and_reports_every_epoch_and_checkpoint(trained: dict[str, Any]) -> None:
    """2 epochs: started, progress, 2 epoch + 2 verified checkpoint events, finished."""
    events = trained["events"]
    assert trained["code"] == EXIT_OK, trained["output"][-4000:]
    assert events[0] == {**events[0], "type": "started", "epochs": 2, "start_epoch": 1}

    progress = of_type(events, "progress")
    assert {e["epoch"] for e in progress} == {1, 2}
    assert all(e["batch"] <= e["batches"] for e in progress)
    assert all(set(e["losses"]) == {"box_loss", "cls_loss", "dfl_loss"} for e in progress)
    assert [e["batch"] == e["batches"] for e in progress].count(True) == 2  # last batch of each epoch

    epochs = of_type(events, "epoch")
    assert [e["epoch"] for e in epochs] == [1, 2]
    for e in epochs:
        values = e["values"]
        for key in ("train/box_loss", "train/cls_loss", "train/dfl_loss", "val/box_loss"):
            assert math.isfinite(values[key])
        for key in ("metrics/precision(B)", "metrics/recall(B)", "metrics/mAP50(B)", "metrics/mAP50-95(B)"):
            assert key in values
        assert "lr/pg0" in values

    checkpoints = of_type(events, "checkpoint")
    assert [c["epoch"] for c in checkpoints] == [1, 2]
    for c in checkpoints:
        path = Path(c["path"])
        assert path.name == f"epoch-{c['epoch']:04d}.pt"
        assert file_sha256(path) == c["sha256"] and path.stat().st_size == c["size"]
        assert json.loads(path.with_suffix(".json").read_text())["sha256"] == c["sha256"]
    # Metrics of an epoch are reported before its checkpoint.
    kinds = [e["type"] for e in events if e["type"] in {"epoch", "checkpoint"}]
    assert kinds == ["epoch", "checkpoint", "epoch", "checkpoint"]

    finished = events[-1]
    assert finished["type"] == "finished" and finished["epochs"] == 2
    assert Path(finished["weights"]).is_file() and Path(finished["last"]).is_file()
    assert "metrics/mAP50-95(B)" in finished["metrics"]
    assert_clean_sandbox(trained["box"])


@pytest.mark.integration
def test_it_resumes_from_the_checkpoint_of_a_killed_attempt(tmp_path: Path) -> None:
    """SIGKILL after checkpoint 1, resume from it: epochs 2 and 3 run, then finished."""
    box = Sandbox(tmp_path, generate_demo_dataset(tmp_path / "demo"))
    first = box.config(epochs=3)
    proc = box.start(first)
    try:
        deadline = time.monotonic() + TRAIN_TIMEOUT_S
        while not of_type(events_of(first), "checkpoint"):
            assert proc.poll() is None, "child exited before its first checkpoint"
            assert time.monotonic() < deadline, "no checkpoint in time"
            time.sleep(0.05)
    finally:
        _kill_group(proc)
    first_events = events_of(first)
    assert not of_type(first_events, "finished")
    checkpoint = of_type(first_events, "checkpoint")[0]
    assert checkpoint["epoch"] == 1

    second = box.config(epochs=3, resume_from=Path(checkpoint["path"]))
    code, output = box.run(second)
    assert code == EXIT_OK, output[-4000:]
    second_events = events_of(second)
    assert second_events[0]["type"] == "started"
    assert second_events[0]["start_epoch"] == 2 and second_events[0]["epochs"] == 3
    assert [e["epoch"] for e in of_type(second_events, "epoch")] == [2, 3]
    trained_epochs = {e["epoch"] for e in of_type(first_events + second_events, "epoch")}
    assert trained_epochs == {1, 2, 3}
    assert second_events[-1]["type"] == "finished" and Path(second_events[-1]["weights"]).is_file()
    assert_clean_sandbox(box)


@pytest.mark.integration
def test_it_reports_a_truncated_checkpoint_with_exit_4(trained: dict[str, Any], tmp_path: Path) -> None:
    """A half-written checkpoint is kind 'checkpoint', so the caller tries an older one."""
    box: Sandbox = trained["box"]
    good = Path(of_type(trained["events"], "checkpoint")[0]["path"])
    truncated = tmp_path / "epoch-0001.pt"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    config = box.config(epochs=2, resume_from=truncated)
    code, output = box.run(config)
    assert code == EXIT_CHECKPOINT, output[-4000:]
    (error,) = events_of(config)
    assert error["type"] == "error" and error["kind"] == "checkpoint"
    assert error["message"] and error["advice"] and error["traceback"]


@pytest.mark.integration
def test_it_reports_a_checkpoint_that_fails_its_sidecar_hash(trained: dict[str, Any], tmp_path: Path) -> None:
    """A complete-looking file whose bytes changed is not trusted."""
    box: Sandbox = trained["box"]
    good = Path(of_type(trained["events"], "checkpoint")[0]["path"])
    copy = tmp_path / "epoch-0001.pt"
    copy.write_bytes(good.read_bytes())
    (tmp_path / "epoch-0001.json").write_text(json.dumps({"epoch": 1, "sha256": "0" * 64, "size": copy.stat().st_size}))
    config = box.config(epochs=2, resume_from=copy)
    code, _ = box.run(config)
    assert code == EXIT_CHECKPOINT
    assert events_of(config)[-1]["kind"] == "checkpoint"


@pytest.mark.integration
def test_resuming_a_finished_run_reports_finished(trained: dict[str, Any]) -> None:
    """The final epoch's checkpoint: nothing to train, the run's best.pt is the result."""
    box: Sandbox = trained["box"]
    final = Path(of_type(trained["events"], "checkpoint")[-1]["path"])
    config = box.config(epochs=2, resume_from=final)
    code, output = box.run(config)
    assert code == EXIT_OK, output[-4000:]
    (finished,) = events_of(config)
    assert finished["type"] == "finished" and finished["epochs"] == 2
    assert finished["weights"] == of_type(trained["events"], "finished")[0]["weights"]


@pytest.mark.integration
def test_a_data_yaml_with_a_download_key_is_refused(trained: dict[str, Any], tmp_path: Path) -> None:
    """Ultralytics would execute it; the child fails with kind 'data' instead."""
    box: Sandbox = trained["box"]
    evil = tmp_path / "evil.yaml"
    data = yaml.safe_load(box.data.read_text())
    evil.write_text(yaml.safe_dump({**data, "download": f"open('{tmp_path}/pwned', 'w')"}))
    config = box.config(epochs=1)
    raw = json.loads(config.read_text())
    config.write_text(json.dumps({**raw, "data": str(evil)}))
    code, _ = box.run(config)
    assert code == EXIT_FAILED
    assert events_of(config)[-1]["kind"] == "data"
    assert not (tmp_path / "pwned").exists()


@pytest.mark.integration
def test_a_cuda_out_of_memory_is_reported_as_such_after_the_checkpoint(tmp_path: Path) -> None:
    """Simulated in the child (no GPU here): epoch 1 is saved, epoch 2 hits "CUDA out of memory"
    at batch 8; the error says it was CUDA's, so the worker retries with half the batch."""
    box = Sandbox(tmp_path, generate_demo_dataset(tmp_path / "demo"))
    config = box.config(epochs=2, fault_cuda_oom_above_batch=4, cpu_threads=1)
    code, output = box.run(config)
    assert code == EXIT_FAILED, output[-4000:]
    events = events_of(config)
    assert events[0]["type"] == "started" and events[0]["batch"] == 8
    assert [c["epoch"] for c in of_type(events, "checkpoint")] == [1]
    error = events[-1]
    assert error["type"] == "error" and error["kind"] == "oom" and error["cuda"] is True and error["batch"] == 8
    assert "CUDA out of memory" in error["message"]
    # Resumed with half the batch, the same fault no longer fires and training finishes.
    checkpoint = Path(of_type(events, "checkpoint")[0]["path"])
    again = box.config(epochs=2, resume_from=checkpoint, batch=4, fault_cuda_oom_above_batch=4)
    code, output = box.run(again)
    assert code == EXIT_OK, output[-4000:]
    resumed = events_of(again)
    assert resumed[0]["start_epoch"] == 2 and resumed[0]["batch"] == 4
    assert resumed[-1]["type"] == "finished"


@pytest.mark.integration
def test_the_stop_file_ends_training_after_the_next_checkpoint(tmp_path: Path) -> None:
    """What the Slurm relay does when the time limit is near (sbatch --signal)."""
    box = Sandbox(tmp_path, generate_demo_dataset(tmp_path / "demo"))
    stop = tmp_path / "stop"
    stop.touch()
    config = box.config(epochs=3, stop_file=str(stop))
    code, output = box.run(config)
    assert code == EXIT_STOPPED, output[-4000:]
    events = events_of(config)
    assert [c["epoch"] for c in of_type(events, "checkpoint")] == [1]
    assert events[-1] == {**events[-1], "type": "stopped", "epoch": 1, "reason": "stop_file"}
    assert not of_type(events, "finished") and not of_type(events, "error")


def test_a_batch_above_the_training_images_is_reported_and_halved_as_the_images(tmp_path: Path) -> None:
    """Ultralytics trains ``batch=64`` of 12 images as batches of 12: the child says 12, so the
    portal's out-of-memory retry halves to 6 (it halved 1024 → 64 of 32 images on an H200, every
    try the same batch of 32)."""
    box = Sandbox(tmp_path, generate_demo_dataset(tmp_path / "demo", train=12, val=4))
    config = box.config(epochs=2, batch=64, fault_cuda_oom_above_batch=8, cpu_threads=1)
    code, output = box.run(config)
    assert code == EXIT_FAILED, output[-4000:]
    events = events_of(config)
    assert events[0]["type"] == "started" and events[0]["batch"] == 12
    error = events[-1]
    assert error["type"] == "error" and error["kind"] == "oom" and error["batch"] == 12
