"""Submits that used to be accepted and then failed (or worse, succeeded wrongly) once they ran are
refused at submit with a 400 naming the field: a task the dataset's labels cannot serve, a val of a
model on a dataset with other classes, an FP16 TorchScript export where no node has a real GPU, a freeze
of every layer of a model YAML."""

from __future__ import annotations

import importlib

import pytest
import yaml
from django.core.files.uploadedfile import SimpleUploadedFile

from apps.core.artifacts import artifact_path
from apps.datasets.demo import CLASS_NAMES
from apps.datasets.models import Dataset
from apps.datasets.services import dataset_delete
from apps.jobs.models import Job, JobState
from apps.jobs.services import attempt_finish, job_submit
from apps.jobs.spec import parse_spec
from apps.registry.models import ModelVersion
from apps.scheduling.inputs import cluster_nodes
from apps.sweeps.models import Trial
from apps.sweeps.services import sweeps_advance
from tests.conftest import api_client
from tests.datasets.archives import DATA_YAML, PNG, make_zip, upload
from tests.registry.conftest import build_checkpoint

pytestmark = pytest.mark.django_db

POLYGON = b"0 0.1 0.1 0.5 0.1 0.5 0.5 0.1 0.5\n1 0.6 0.6 0.9 0.6 0.9 0.9\n"


@pytest.fixture(autouse=True)
def stores(settings, tmp_path):
    settings.JOBS_DIR = tmp_path / "jobs"
    settings.MODELS_DIR = tmp_path / "models"
    return settings


def dataset_post(user, name: str, label: bytes, data_yaml: str = DATA_YAML) -> dict:
    files = {"data.yaml": data_yaml.encode()}
    for split in ("train", "val"):
        for n in range(2):
            files[f"images/{split}/{n}.png"] = PNG
            files[f"labels/{split}/{n}.txt"] = label
    response = api_client(user).post("/api/v1/datasets/", {"file": upload(make_zip(files)), "name": name},
                                     format="multipart")
    assert response.status_code == 201, response.content
    return response.json()


def submit(user, command: str | None = None, **fields):
    body = {"task_name": "t", "user": "vision", "allow_duplicate": True, **fields}
    if command:
        body["command"] = command
    return api_client(user).post("/api/v1/jobs/", body, format="json")


# --- the task against what the dataset's labels hold ---------------------------------------------


def test_a_segment_training_on_a_dataset_of_boxes_is_refused_on_the_data_field(bob, demo_registered):
    response = submit(bob, "yolo segment train data=demo model=yolov8n-seg.yaml epochs=1")
    assert response.status_code == 400
    message = response.json()["command.data"][0]
    assert "holds boxes (detection labels)" in message and "segment jobs need a polygon outline" in message
    assert "the command's task is segment" in message
    assert not Job.objects.exists()


def test_a_classify_training_on_a_yolo_dataset_is_refused(bob, demo_registered):
    response = submit(bob, "yolo classify train data=demo model=yolov8n-cls.yaml epochs=1")
    assert response.status_code == 400
    assert "classify jobs need a classification dataset" in response.json()["command.data"][0]


def test_the_structured_form_names_its_own_data_field(bob, demo_registered):
    response = submit(bob, train={"data": "demo", "model": "yolov8n-obb.yaml", "epochs": 1}, task="obb")
    assert response.status_code == 400
    message = response.json()["train.data"][0]
    assert "obb jobs need a polygon" in message and "the spec's task is obb" in message


def test_polygons_serve_segment_obb_and_detect_jobs(bob):
    assert dataset_post(bob, "parts", POLYGON)["stats"]["labels"] == "polygons"
    for command in ("yolo segment train data=parts model=yolov8n-seg.yaml epochs=1",
                    "yolo obb train data=parts model=yolov8n-obb.yaml epochs=1",
                    "yolo train data=parts model=yolov8n.yaml epochs=1"):
        assert submit(bob, command).status_code == 201, command


def test_boxes_beside_polygons_serve_detect_only(bob):
    """Boxes in some label files, polygons in others (one file mixing them is refused at upload:
    Ultralytics skips it, tests/datasets)."""
    files = {"data.yaml": DATA_YAML.encode()}
    for split in ("train", "val"):
        for n, label in enumerate((POLYGON, b"1 0.5 0.5 0.2 0.2\n")):
            files[f"images/{split}/{n}.png"] = PNG
            files[f"labels/{split}/{n}.txt"] = label
    assert api_client(bob).post("/api/v1/datasets/", {"file": upload(make_zip(files)), "name": "mixed"},
                                format="multipart").status_code == 201
    response = submit(bob, "yolo segment train data=mixed model=yolov8n-seg.yaml epochs=1")
    assert response.status_code == 400
    assert "holds boxes (detection labels) and polygons" in response.json()["command.data"][0]
    assert submit(bob, "yolo detect train data=mixed model=yolov8n.yaml epochs=1").status_code == 201


def test_keypoints_without_kpt_shape_are_named_for_a_pose_job(bob):
    dataset_post(bob, "people", b"0 0.5 0.5 0.2 0.2 0.45 0.45 2\n")
    response = submit(bob, "yolo pose train data=people model=yolov8n-pose.yaml epochs=1")
    assert response.status_code == 400
    assert "holds keypoints (pose labels) but its data.yaml has no kpt_shape" in response.json()["command.data"][0]


POSE_YAML = DATA_YAML + "kpt_shape: [2, 3]\nflip_idx: [1, 0]\nkpt_names: {0: [left, right]}\n"
POSE = b"0 0.5 0.5 0.2 0.2 0.45 0.45 2 0.55 0.45 1\n"  # a box, then 2 keypoints of x y visibility


def test_an_uploaded_pose_dataset_keeps_its_kpt_shape_and_serves_a_pose_job(bob):
    """Uploads rewrite data.yaml: kpt_shape and flip_idx stay in it, so Ultralytics can train pose on it,
    and kpt_names, which the trained model and its exports carry (it was dropped)."""
    stats = dataset_post(bob, "people", POSE, data_yaml=POSE_YAML)["stats"]
    assert (stats["labels"], stats["kpt_shape"]) == ("keypoints", [2, 3])
    stored = yaml.safe_load(artifact_path(Dataset.objects.get(name="people").yaml_key).read_text())
    assert (stored["kpt_shape"], stored["flip_idx"], stored["kpt_names"]) == ([2, 3], [1, 0], {0: ["left", "right"]})
    response = submit(bob, "yolo pose train data=people model=yolov8n-pose.yaml epochs=1")
    assert response.status_code == 201, response.content


@pytest.mark.parametrize(("data_yaml", "where", "problem"), [
    (DATA_YAML + "kpt_shape: [2, 4]\n", "data.yaml: kpt_shape", "must be 2 (x y) or 3 (x y visibility)"),
    (DATA_YAML + "kpt_shape: 17\n", "data.yaml: kpt_shape", "two positive whole numbers"),
    (DATA_YAML + "kpt_shape: [2, 3]\nflip_idx: [0, 0]\n", "data.yaml: flip_idx", "each keypoint 0…1 once"),
    (DATA_YAML + "kpt_shape: [2, 3]\nkpt_names: {0: [nose]}\n", "data.yaml: kpt_names", "lists of 2 keypoint names"),
    (DATA_YAML + "kpt_shape: [2, 3]\nkpt_names: {7: [a, b]}\n", "data.yaml: kpt_names", "7 is no class id of names"),
    (DATA_YAML + "kpt_names: {0: [a, b]}\n", "data.yaml: kpt_names", "without kpt_shape"),
])
def test_a_bad_kpt_shape_or_flip_idx_is_refused_naming_data_yaml(bob, data_yaml, where, problem):
    files = {"data.yaml": data_yaml.encode(), "images/train/0.png": PNG, "labels/train/0.txt": POSE,
             "images/val/0.png": PNG, "labels/val/0.txt": POSE}
    response = api_client(bob).post("/api/v1/datasets/", {"file": upload(make_zip(files)), "name": "people"},
                                    format="multipart")
    assert response.status_code == 400
    problems = {p["path"]: p["problem"] for p in response.json()["problems"]}
    assert problem in problems[where], problems
    assert not Dataset.objects.exists()


def test_pose_labels_must_hold_the_keypoints_kpt_shape_names(bob):
    """Each line of a pose dataset is the box and k·d keypoint values: other counts are refused per file."""
    files = {"data.yaml": (DATA_YAML + "kpt_shape: [3, 3]\n").encode(), "images/train/0.png": PNG,
             "labels/train/0.txt": POSE, "images/val/0.png": PNG, "labels/val/0.txt": b"0 0.5 0.5 0.2 0.2\n"}
    response = api_client(bob).post("/api/v1/datasets/", {"file": upload(make_zip(files)), "name": "people"},
                                    format="multipart")
    assert response.status_code == 400
    problems = {p["path"]: p["problem"] for p in response.json()["problems"]}
    assert "kpt_shape [3, 3] means 'class x_center y_center width height' and 3×3 keypoint values " \
           "(13 numbers after the class), got 10" in problems["labels/train/0.txt"]
    assert "got 4" in problems["labels/val/0.txt"]


def test_a_dataset_whose_labels_were_never_recorded_is_left_to_run(bob, demo_registered):
    """Rows stored before the label kind was: not known, so not refused."""
    demo = Dataset.objects.get(team__slug="vision", name="demo")
    Dataset.objects.filter(pk=demo.pk).update(stats={k: v for k, v in demo.stats.items() if k != "labels"})
    assert submit(bob, "yolo segment train data=demo model=yolov8n-seg.yaml epochs=1").status_code == 201


# --- a val job's classes against the model's ------------------------------------------------------


def finish_training(job) -> ModelVersion:
    """What the worker reports when a training attempt succeeded (the real service path)."""
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING)
    job.refresh_from_db()
    weights = job.run_dir / "train" / "weights" / "best.pt"
    weights.parent.mkdir(parents=True, exist_ok=True)
    weights.write_bytes(b"weights")
    finished = {"mode": "train", "weights": str(weights), "metrics": {}, "code": {}, "exports": []}
    assert attempt_finish(job, outcome="succeeded", exit_code=0, finished=finished) == "succeeded"
    return ModelVersion.objects.get(job=job)


@pytest.fixture
def shapes_v1(bob, demo_registered) -> ModelVersion:
    """pcb:v1, trained on the demo dataset: rectangle, circle, triangle."""
    spec = parse_spec({"task_name": "pcb", "command": "yolo train data=demo model=yolov8n.yaml epochs=1",
                       "user": "vision"})
    return finish_training(job_submit(user=bob, spec=spec)[0])


def test_a_val_on_a_dataset_with_other_classes_is_refused_naming_both(bob, shapes_v1):
    dataset_post(bob, "scratches", b"0 0.5 0.5 0.2 0.2\n")  # names: scratch, dent
    response = submit(bob, "yolo val model=pcb:v1 data=scratches")
    assert response.status_code == 400
    message = response.json()["command.data"][0]
    assert "dataset scratches:v1 has 2 classes (scratch, dent) and model pcb:v1 3 (rectangle, circle, triangle)" \
        in message
    assert "class 0 is 'scratch' in the dataset and 'rectangle' in the model" in message
    assert "it was trained on demo:v" in message


def test_a_val_on_the_models_own_classes_or_with_single_cls_runs(bob, shapes_v1):
    dataset_post(bob, "scratches", b"0 0.5 0.5 0.2 0.2\n")
    assert submit(bob, "yolo val model=pcb:v1 data=demo").status_code == 201
    assert submit(bob, "yolo val model=pcb:v1 data=scratches single_cls=true").status_code == 201


def test_a_val_of_a_model_whose_classes_are_not_known_runs(bob, shapes_v1):
    """Uploaded weights do not say their classes here: left to run."""
    ModelVersion.objects.filter(pk=shapes_v1.pk).update(source=ModelVersion.Source.UPLOAD)
    dataset_post(bob, "scratches", b"0 0.5 0.5 0.2 0.2\n")
    assert submit(bob, "yolo val model=pcb:v1 data=scratches").status_code == 201


def test_a_trained_version_keeps_its_classes_when_its_dataset_is_deleted(bob, alice, shapes_v1):
    """The check read the training dataset's row: deleting it let a mismatched val file an evaluation."""
    dataset_delete(dataset=Dataset.objects.get(pk=shapes_v1.dataset_id), by=alice)
    dataset_post(bob, "scratches", b"0 0.5 0.5 0.2 0.2\n")

    response = submit(bob, "yolo val model=pcb:v1 data=scratches")

    assert response.status_code == 400
    message = response.json()["command.data"][0]
    assert "dataset scratches:v1 has 2 classes (scratch, dent) and model pcb:v1 3 (rectangle, circle, triangle)" \
        in message and "it was trained on demo:v1" in message


def test_a_val_of_a_trained_version_whose_classes_are_unknown_is_refused_naming_both(bob, shapes_v1):
    """A version registered before it kept its names, whose dataset and weights are gone."""
    ModelVersion.objects.filter(pk=shapes_v1.pk).update(
        dataset=None, lineage={k: v for k, v in shapes_v1.lineage.items() if k != "class_names"})
    dataset_post(bob, "scratches", b"0 0.5 0.5 0.2 0.2\n")

    response = submit(bob, "yolo val model=pcb:v1 data=scratches")

    assert response.status_code == 400
    assert ("dataset scratches:v1 has 2 classes (scratch, dent) and the classes of model pcb:v1 are not known "
            "(it was trained on demo:v1, which is gone") in response.json()["command.data"][0]
    assert submit(bob, "yolo val model=pcb:v1 data=scratches single_cls=true").status_code == 201


def test_the_migration_gives_older_trained_versions_their_classes(bob, shapes_v1, shapes_pt):
    """From the training dataset where it still exists, else from the weights file's model."""
    from django.apps import apps

    backfill = importlib.import_module("apps.registry.migrations.0005_trained_versions_keep_class_names")
    unnamed = {k: v for k, v in shapes_v1.lineage.items() if k != "class_names"}
    ModelVersion.objects.filter(pk=shapes_v1.pk).update(lineage=unnamed)
    assert backfill.class_names_backfill(apps) == 1
    assert ModelVersion.objects.get(pk=shapes_v1.pk).lineage["class_names"] == ["rectangle", "circle", "triangle"]

    ModelVersion.objects.filter(pk=shapes_v1.pk).update(lineage=unnamed, dataset=None)
    artifact_path(shapes_v1.weights_key).write_bytes(shapes_pt.read_bytes())
    assert backfill.class_names_backfill(apps) == 1
    assert ModelVersion.objects.get(pk=shapes_v1.pk).lineage["class_names"] == ["rectangle", "circle", "triangle"]


@pytest.fixture(scope="module")
def shapes_pt(tmp_path_factory):
    """A real checkpoint, saved by Ultralytics, whose model names the demo dataset's classes."""
    return build_checkpoint("yolov8n.yaml", tmp_path_factory.mktemp("weights"), names=dict(CLASS_NAMES))


def test_a_val_of_uploaded_weights_is_checked_against_the_classes_their_model_names(bob, demo_registered,
                                                                                     shapes_pt):
    """The upload's checkpoint scan reads the model's names: a val of those weights is class-checked too."""
    file = SimpleUploadedFile("shapes.pt", shapes_pt.read_bytes(), content_type="application/octet-stream")
    assert api_client(bob).post("/api/v1/weights/", {"file": file}, format="multipart").status_code == 201
    dataset_post(bob, "scratches", b"0 0.5 0.5 0.2 0.2\n")
    response = submit(bob, "yolo val model=shapes:v1 data=scratches")
    assert response.status_code == 400
    assert "dataset scratches:v1 has 2 classes (scratch, dent) and model shapes:v1 3 (rectangle, circle, triangle)" \
        in response.json()["command.data"][0]
    assert submit(bob, "yolo val model=shapes:v1 data=demo").status_code == 201


def test_a_val_of_shared_weights_is_checked_against_the_classes_their_scan_read(bob, demo_registered, shapes_pt,
                                                                              settings, tmp_path):
    """Shared base weights were never class-checked (only registered versions were): the scan at
    ``weights add --shared`` reads their names too. A file replaced by hand beside the command
    is not what was scanned: left to run."""
    from apps.registry.services import shared_weights_add

    settings.WEIGHTS_DIR = tmp_path / "weights"
    shared_weights_add(source=shapes_pt, filename="shapes-base.pt")
    dataset_post(bob, "scratches", b"0 0.5 0.5 0.2 0.2\n")
    response = submit(bob, "yolo val model=shapes-base.pt data=scratches")
    assert response.status_code == 400
    assert ("dataset scratches:v1 has 2 classes (scratch, dent) and model weights shapes-base.pt 3 "
            "(rectangle, circle, triangle)") in response.json()["command.data"][0]
    assert submit(bob, "yolo val model=shapes-base.pt data=demo").status_code == 201
    (settings.WEIGHTS_DIR / "shapes-base.pt").write_bytes(shapes_pt.read_bytes() + b"\0")
    assert submit(bob, "yolo val model=shapes-base.pt data=scratches").status_code == 201


def test_a_val_of_a_segment_model_on_boxes_is_refused(bob, shapes_v1):
    ModelVersion.objects.filter(pk=shapes_v1.pk).update(task="segment")
    response = submit(bob, "yolo val model=pcb:v1 data=demo")
    assert response.status_code == 400
    assert "pcb:v1 is a segment model" in response.json()["command.data"][0]


def test_a_version_records_the_task_its_starting_weights_trained(bob, shapes_v1):
    """The worker trains as the weights' task says, whatever the command's default: so does the registry."""
    ModelVersion.objects.filter(pk=shapes_v1.pk).update(task="segment")
    dataset_post(bob, "parts", POLYGON)
    spec = parse_spec({"task_name": "pcb-seg", "command": "yolo train data=parts model=pcb:v1 epochs=1",
                       "user": "vision"})
    assert finish_training(job_submit(user=bob, spec=spec)[0]).task == "segment"


# --- a named task against the model's own -----------------------------------------------------------


def test_a_named_task_other_than_the_starting_weights_is_refused_on_the_model_field(bob, shapes_v1):
    """Ultralytics trains weights as their own task whatever the command says: refused, naming both."""
    dataset_post(bob, "parts", POLYGON)
    response = submit(bob, "yolo segment train data=parts model=pcb:v1 epochs=1")
    assert response.status_code == 400
    body = response.json()
    assert set(body) == {"command.model"}, body
    assert "pcb:v1 holds a detect model, and the command's task is segment: Ultralytics would ignore segment " \
           "and train it as detect" in body["command.model"][0]
    response = submit(bob, train={"data": "parts", "model": "pcb:v1"}, task="pose")
    assert "pcb:v1 holds a detect model, and the spec's task is pose" in response.json()["train.model"][0]
    response = submit(bob, "yolo segment val data=parts model=pcb:v1")
    assert "would ignore segment and validate it as detect" in response.json()["command.model"][0]


def test_a_task_left_to_the_default_agreeing_or_of_unknown_weights_runs(bob, shapes_v1):
    dataset_post(bob, "parts", POLYGON)
    assert submit(bob, "yolo train data=parts model=pcb:v1 epochs=1").status_code == 201
    assert submit(bob, "yolo detect train data=parts model=pcb:v1 epochs=1").status_code == 201
    ModelVersion.objects.filter(pk=shapes_v1.pk).update(task="")
    assert submit(bob, "yolo segment train data=parts model=pcb:v1 epochs=1").status_code == 201


def test_a_model_yaml_is_the_task_it_builds(bob, demo_registered):
    """yolov8n-seg.yaml builds a segment model (Ultralytics reads its head): the task it runs, unless
    the command names another, which is refused."""
    dataset_post(bob, "parts", POLYGON)
    response = submit(bob, "yolo segment train data=parts model=yolov8n.yaml epochs=1")
    assert response.status_code == 400
    assert "yolov8n.yaml builds a detect model, and the command's task is segment: give a segment model YAML " \
           "(e.g. yolov8n-seg.yaml)" in response.json()["command.model"][0]
    response = submit(bob, "yolo train data=demo model=yolov8n-seg.yaml epochs=1")
    assert response.status_code == 400
    assert "(yolov8n-seg.yaml is a segment model)" in response.json()["command.data"][0]
    response = submit(bob, "yolo train data=parts model=yolo11n-seg.yaml epochs=1")
    assert response.status_code == 201, response.content
    assert Job.objects.get(pk=response.json()["id"]).spec["resolved"]["task"] == "segment"


def test_a_sweeps_trials_keep_a_task_the_sweep_left_to_its_model(bob, node):
    """Trials are the sweep's spec submitted again: a task it left out stays left out, not a named detect."""
    dataset_post(bob, "parts", POLYGON)
    response = submit(bob, "yolo train data=parts model=yolov8n-seg.yaml epochs=1 imgsz=64 optimizer=SGD",
                      sweep={"parameters": {"lr0": [0.01, 0.001]}, "method": "grid"})
    assert response.status_code == 201, response.content
    sweeps_advance()
    assert not Trial.objects.exclude(note="").values_list("note", flat=True).first()
    trials = Job.objects.filter(parent_id=response.json()["id"])
    assert [trial.spec["resolved"]["task"] for trial in trials] == ["segment", "segment"]


# --- freeze against the model's layers (trial25 F13) ---------------------------------------------------


def test_a_freeze_of_every_layer_of_a_model_yaml_is_refused_naming_the_layer_count(bob, demo_registered):
    """Ultralytics freezes model.0 … model.{freeze-1}: freeze=99 on yolov8n.yaml's 23 layers left nothing to
    train and failed once it ran ("froze the entire model")."""
    response = submit(bob, "yolo train data=demo model=yolov8n.yaml epochs=1 freeze=99")
    assert response.status_code == 400
    body = response.json()
    assert set(body) == {"command.freeze"}, body
    assert "is 99, and yolov8n.yaml has 23 layers (0 to 22)" in body["command.freeze"][0]
    assert "give at most 22" in body["command.freeze"][0]
    response = submit(bob, train={"data": "demo", "model": "yolov8n-cls.yaml", "freeze": 10})
    assert "yolov8n-cls.yaml has 10 layers" in response.json()["train.freeze"][0]
    assert not Job.objects.exists()


def test_a_freeze_that_leaves_the_head_to_train_is_accepted(bob, demo_registered):
    assert submit(bob, "yolo train data=demo model=yolov8n.yaml epochs=1 freeze=22").status_code == 201
    assert submit(bob, "yolo train data=demo model=yolo11n.yaml epochs=1 freeze=10").status_code == 201


def test_a_freeze_on_registered_weights_is_left_to_the_trainer(bob, shapes_v1):
    """Their layer count is not known without loading them: accepted, the trainer's message stays."""
    assert submit(bob, "yolo train data=demo model=pcb:v1 epochs=1 freeze=99").status_code == 201


def test_a_sweep_whose_freeze_range_passes_the_model_is_refused_on_its_bound(bob, demo_registered):
    response = submit(bob, "yolo train data=demo model=yolov8n.yaml epochs=1",
                      sweep={"parameters": {"freeze": {"low": 0, "high": 30}}, "method": "random", "trials": 2})
    assert response.status_code == 400
    assert "is 30, and yolov8n.yaml has 23 layers" in response.json()["sweep.parameters.freeze.high"][0]
    response = submit(bob, "yolo train data=demo model=yolov8n.yaml epochs=1",
                      sweep={"parameters": {"freeze": [0, 10, 23]}, "method": "grid"})
    assert "is 23, and yolov8n.yaml has 23 layers" in response.json()["sweep.parameters.freeze[2]"][0]


# --- FP16 TorchScript needs a real GPU ----------------------------------------------------------------


def test_an_fp16_torchscript_export_is_refused_when_every_node_is_simulated(bob, shapes_v1, node):
    response = submit(bob, "yolo export model=pcb:v1 format=torchscript half=true")
    assert response.status_code == 400
    body = response.json()
    assert "half precision (FP16) TorchScript is exported on a GPU" in body["command.half"][0]
    assert "drop half=true" in body["command.half"][0]
    assert set(body) == {"command.half"}, body
    assert submit(bob, "yolo export model=pcb:v1 format=onnx half=true").status_code == 201
    assert submit(bob, "yolo export model=pcb:v1 format=torchscript").status_code == 201


def test_an_fp16_torchscript_export_waits_for_a_node_with_a_real_gpu(bob, shapes_v1, node):
    type(node).objects.filter(pk=node.pk).update(simulated=False)
    response = submit(bob, "yolo export model=pcb:v1 format=torchscript half=true")
    assert response.status_code == 201, response.content
    assert Job.objects.get(pk=response.json()["id"]).spec["requires"] == ["cuda"]
    node.refresh_from_db()
    assert "cuda" in cluster_nodes([node])[0].features
    type(node).objects.filter(pk=node.pk).update(simulated=True)
    node.refresh_from_db()
    assert "cuda" not in cluster_nodes([node])[0].features
