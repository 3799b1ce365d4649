"""A sweep without a ``metric`` maximises its task's own figure: box mAP50-95 for detect and obb, the
masks' for segment, the keypoints' for pose, top-1 accuracy for classify (it was box mAP50-95 for
every task: a segment sweep ranked its trials by their boxes, a classify one could not run at all).
A metric the spec names is kept as given, and one the task never reports is still refused."""

from __future__ import annotations

import pytest

from apps.jobs.models import Job
from tests.conftest import api_client
from tests.datasets.archives import PNG, make_zip, upload

pytestmark = pytest.mark.django_db

POLYGON = b"0 0.1 0.1 0.6 0.1 0.6 0.6 0.1 0.6\n"
LABELS = {"boxes": ("", b"0 0.5 0.5 0.2 0.2\n"), "polygons": ("", POLYGON),
          "points": ("kpt_shape: [1, 2]\n", b"0 0.5 0.5 0.2 0.2 0.5 0.5\n")}


@pytest.fixture(autouse=True)
def datasets(settings, tmp_path, bob):
    """One dataset per kind of label (boxes, polygons, keypoints) and a classification one (pets)."""
    settings.DATASETS_DIR = tmp_path / "datasets"
    archives = {"pets": {f"{s}/{c}/{n}.png": PNG for s in ("train", "val") for c in ("cat", "dog") for n in (0, 1)}}
    for name, (extra, label) in LABELS.items():
        files = {"data.yaml": f"train: images/train\nval: images/val\nnames: [part]\n{extra}".encode()}
        for split in ("train", "val"):
            files[f"images/{split}/0.png"], files[f"labels/{split}/0.txt"] = PNG, label
        archives[name] = files
    for name, files in archives.items():
        response = api_client(bob).post("/api/v1/datasets/", {"file": upload(make_zip(files)), "name": name},
                                        format="multipart")
        assert response.status_code == 201, response.content


def submit_sweep(user, command: str, **sweep):
    spec = {"task_name": "sweep", "command": f"{command} epochs=2 imgsz=32 optimizer=SGD", "resources": {"gpu": 1},
            "sweep": {"method": "grid", "parameters": {"lr0": [0.01, 0.02]}, **sweep}}
    return api_client(user).post("/api/v1/jobs/", spec, format="json")


@pytest.mark.parametrize(("command", "metric"), [
    ("yolo train data=boxes model=yolov8n.yaml", "metrics/mAP50-95(B)"),
    ("yolo train data=polygons model=yolov8n-obb.yaml", "metrics/mAP50-95(B)"),
    ("yolo train data=polygons model=yolov8n-seg.yaml", "metrics/mAP50-95(M)"),
    ("yolo train data=points model=yolov8n-pose.yaml", "metrics/mAP50-95(P)"),
    ("yolo classify train data=pets model=yolov8n-cls.yaml", "metrics/accuracy_top1"),
])
def test_a_sweep_without_a_metric_maximises_its_tasks_own_figure(bob, command, metric):
    response = submit_sweep(bob, command)
    assert response.status_code == 201, response.content
    assert Job.objects.get(pk=response.json()["id"]).spec["sweep"]["metric"] == metric


def test_a_metric_the_spec_names_is_kept_even_when_the_task_has_its_own(bob):
    """A segment engineer may mean the boxes: said explicitly, it is what the sweep maximises."""
    response = submit_sweep(bob, "yolo train data=polygons model=yolov8n-seg.yaml", metric="metrics/mAP50(B)")
    assert response.status_code == 201, response.content
    assert Job.objects.get(pk=response.json()["id"]).spec["sweep"]["metric"] == "metrics/mAP50(B)"


def test_a_named_metric_the_task_never_reports_is_still_refused(bob):
    response = submit_sweep(bob, "yolo classify train data=pets model=yolov8n-cls.yaml", metric="metrics/mAP50-95(B)")
    assert response.status_code == 400
    assert response.json()["sweep.metric"][0].startswith(
        "metrics/mAP50-95(B) is not a metric a classify training reports")
