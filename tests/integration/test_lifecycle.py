"""Issue 10's acceptance story, end to end with real parts: manage.py team, yoloq dataset push (a folder
and a zip), yoloq weights push (weights saved here from a model built from its YAML — nothing is
downloaded), the brief's example YAML byte for byte accepted and started on a node that advertises
8 CPUs / 32 GiB, then a short fine-tune from those weights (exporting TorchScript after success),
val, predict and an ONNX export verified by onnxruntime — a real web server, scheduler, gpu_worker
and Ultralytics on tiny data on CPU."""

from __future__ import annotations

import io
import shutil
import zipfile
from pathlib import Path

import pytest
from django.core.management import call_command

from apps.accounts.services import token_create
from apps.datasets.demo import generate_demo_dataset
from apps.jobs.models import Job, JobState
from apps.registry.models import Evaluation, Export, ModelVersion, PredictionRun
from cli import yoloq
from tests.conftest import api_client
from tests.portal.liveweb import WebServer
from tests.registry.conftest import build_checkpoint

from .live import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

# The brief's example, byte for byte.
BRIEF_SPEC = '''task_name: "yolo-v8s-industrial-inspection"
image: "ultralytics/yolov8:latest"
command: "yolo train data=pcb_defect.yaml model=yolov8s.pt epochs=100 imgsz=640"
resources:
  gpu: 1
  memory: "16Gi"
  cpu: "4"
priority: medium
user: "team-a"
timeout: 72000 # longest run time (seconds)
'''
TERMINAL = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMED_OUT)


def user_dataset(root: Path, name: str = "pcb_defect") -> Path:
    """A dataset folder as a user has it: data.yaml without server paths, images/ and labels/."""
    generated = generate_demo_dataset(root / "generated", train=8, val=4, imgsz=64).parent
    folder = root / name
    for sub in ("images", "labels"):
        shutil.copytree(generated / sub, folder / sub)
    (folder / "data.yaml").write_text("train: images/train\nval: images/val\n"
                                      "names: {0: rectangle, 1: circle, 2: triangle}\n")
    return folder


def yoloq_run(capsys, *argv) -> str:
    code = yoloq.main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def finished(job_id) -> Job:
    return wait_for(lambda: (j := Job.objects.get(pk=job_id)).state in TERMINAL and j, timeout=420, interval=0.5,
                    what=f"job {job_id} to finish")


@pytest.fixture
def portal(live, tmp_path, monkeypatch):
    web = WebServer(live, tmp_path)
    monkeypatch.setenv("YOLOQ_CONFIG", str(tmp_path / "yoloq.json"))
    yield web
    web.stop()


def test_the_acceptance_story(live, portal, tmp_path, capsys):
    # 1. An operator makes the team from the command line.
    call_command("team", "create", "team-a", "--manager", "alice", "--member", "bob", stdout=io.StringIO())
    from django.contrib.auth import get_user_model

    alice = get_user_model().objects.get(username="alice")
    _, key = token_create(user=alice, name="cli")
    yoloq_run(capsys, "login", portal.url, "--token", key)

    # 2. alice pushes her dataset as a folder (again unchanged: no new version), then with one
    # more box as a zip: two versions.
    folder = user_dataset(tmp_path)
    out = yoloq_run(capsys, "dataset", "push", str(folder), "--team", "team-a")
    assert "Stored team-a/pcb_defect:v1: 12 images (train 8, val 4), 3 classes" in out
    assert "Unchanged: team-a/pcb_defect:v1" in yoloq_run(capsys, "dataset", "push", str(folder), "--team", "team-a")
    archive = tmp_path / "pcb_defect.zip"
    labels = sorted(folder.rglob("*.txt"))
    with zipfile.ZipFile(archive, "w") as z:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                extra = b"0 0.5 0.5 0.1 0.1\n" if path == labels[0] else b""
                z.writestr(path.relative_to(folder).as_posix(), path.read_bytes() + extra)
    assert yoloq_run(capsys, "dataset", "push", str(archive), "--team", "team-a", "-q").strip() == "pcb_defect:v2"

    # 3. ... and her pretrained weights, saved here from a model built from its YAML.
    weights = build_checkpoint("yolov8n.yaml", tmp_path)
    shutil.copy(weights, tmp_path / "yolov8s.pt")
    out = yoloq_run(capsys, "weights", "push", str(tmp_path / "yolov8s.pt"), "--team", "team-a")
    assert "Stored yolov8s.pt for team-a as yolov8s:v1 (detect" in out
    uploaded = ModelVersion.objects.get(name="yolov8s")

    # 4. The brief's example YAML, byte for byte, on a node that advertises enough CPU and memory.
    live.start_scheduler()
    live.start("worker", "gpu_worker", "--name", "node-a", "--simulate-gpus", "1", "--cpus", "8", "--memory", "32Gi")
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(BRIEF_SPEC)
    example_id = yoloq_run(capsys, "submit", str(spec_file), "-q").strip()
    example = Job.objects.get(pk=example_id)
    assert example.spec["inputs"]["data"]["name"] == "pcb_defect" and example.spec["inputs"]["data"]["version"] == 2
    assert example.spec["inputs"]["model"] == uploaded.as_parent()
    wait_for(lambda: example.events.filter(kind="training_started").exists(), timeout=240,
             what="the example job to start training")
    client = api_client(alice)
    assert client.post(f"/api/v1/jobs/{example_id}/cancel/").status_code == 202
    assert finished(example_id).state == JobState.CANCELLED

    # 5a. A short fine-tune from the uploaded weights, on v1 of the data, exporting TorchScript after success.
    def submit(command: str, **extra) -> str:
        body = {"task_name": "pcb-finetune" if " train " in f" {command} " else command.split()[1],
                "command": command, "user": "team-a", "resources": {"gpu": 1, "cpu": "1", "memory": "2Gi"},
                "timeout": 1800, **extra}
        response = client.post("/api/v1/jobs/", body, format="json")
        assert response.status_code == 201, response.content
        return response.json()["id"]

    tune = finished(submit("yolo train data=pcb_defect:v1 model=yolov8s.pt epochs=1 imgsz=64 batch=4",
                           export=["torchscript"]))
    assert tune.state == JobState.SUCCEEDED, tune.error
    version = ModelVersion.objects.get(job=tune)
    assert version.parent == uploaded and version.lineage["parent"]["sha256"] == uploaded.sha256
    assert (version.dataset.version, version.lineage["dataset"]["sha256"]) == (1, version.dataset.sha256)
    assert {"torch", "ultralytics", "python"} <= set(version.lineage["code"])
    torchscript = Export.objects.get(version=version, format="torchscript")
    assert torchscript.verification["passed"] and torchscript.verification["images"] >= 1

    # 5b. val on the registered version, the validation split: metrics and the per-class table.
    val = finished(submit(f"yolo val model={version.reference} data=pcb_defect split=val imgsz=64"))
    assert val.state == JobState.SUCCEEDED, val.error
    evaluation = Evaluation.objects.get(job=val)
    assert evaluation.version == version and evaluation.split == "val"
    assert "metrics/mAP50-95(B)" in evaluation.metrics and evaluation.dataset_lineage["version"] == 2
    for row in evaluation.per_class:
        assert {"name", "precision", "recall", "map50", "map50_95"} <= set(row)

    # 5c. predict on a dataset split: annotated images, boxes as JSON, the gallery.
    predict = finished(submit(f"yolo predict model={version.reference} source=pcb_defect split=val imgsz=64 conf=0.01"))
    assert predict.state == JobState.SUCCEEDED, predict.error
    run = PredictionRun.objects.get(job=predict)
    assert run.images == 4 and run.version == version
    results = client.get(f"/api/v1/jobs/{predict.pk}/predictions/").json()["results"]
    assert len(results) == 4 and all(r["source"].startswith("val_") or "val" in r["source"] for r in results)
    image = client.get(results[0]["url"])
    assert image.status_code == 200 and b"".join(image.streaming_content)[:2] == b"\xff\xd8"

    # 5c'. ... and on uploaded images (an images-only upload, every image of it).
    shots = tmp_path / "shots"
    shots.mkdir()
    for image in sorted((folder / "images" / "val").iterdir())[:2]:
        shutil.copy(image, shots / image.name)
    assert yoloq_run(capsys, "dataset", "push", str(shots), "--team", "team-a", "--kind", "images",
                     "-q").strip() == "shots:v1"
    on_shots = finished(submit(f"yolo predict model={version.reference} source=shots imgsz=64"))
    assert on_shots.state == JobState.SUCCEEDED, on_shots.error
    assert PredictionRun.objects.get(job=on_shots).images == 2

    # 5d. export onnx: verified by onnxruntime against the PyTorch model's raw outputs.
    export_job = finished(submit(f"yolo export model={version.reference} format=onnx imgsz=64"))
    assert export_job.state == JobState.SUCCEEDED, export_job.error
    onnx = Export.objects.get(job=export_job)
    check = onnx.verification
    assert check["passed"] and check["runtime"].startswith("onnxruntime") and check["images"] == 4
    assert check["outputs"][0][0] == 1 and check["max_abs"] >= 0 and check["rtol"] == 1e-3
    download = client.get(f"/api/v1/exports/{onnx.pk}/download/")
    assert download.status_code == 200
    import onnxruntime

    onnxruntime.InferenceSession(b"".join(download.streaming_content), providers=["CPUExecutionProvider"])
    print(f"ONNX agreement: max abs {check['max_abs']:.3g}, max rel {check['max_rel']:.3g}")
