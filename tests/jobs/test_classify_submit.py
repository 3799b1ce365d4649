"""Submitting classify jobs: a classify task needs a classification dataset and a -cls model (its YAML
or weights whose head classifies); every mismatch is refused naming the field. Val of a classify model
and predict are accepted; so is export, verified on a classification dataset's images
(worker.model_modes.verify_export compares class probabilities and top-1)."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from apps.datasets.models import Dataset
from apps.jobs.models import Job
from apps.registry.models import ModelVersion
from tests.conftest import api_client
from tests.datasets.archives import PNG, make_zip, upload, valid_files
from tests.registry.conftest import build_checkpoint

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def storage(settings, tmp_path):
    settings.DATASETS_DIR = tmp_path / "datasets"
    settings.WEIGHTS_DIR = tmp_path / "weights"


@pytest.fixture
def pets(bob):
    """A classification dataset (cat, dog) and a detection one (pcb), both the vision team's."""
    files = {f"{split}/{name}/{n}.png": PNG for split in ("train", "val") for name in ("cat", "dog") for n in range(2)}
    for name, content in (("pets", make_zip(files)), ("pcb", make_zip(valid_files()))):
        response = api_client(bob).post("/api/v1/datasets/", {"file": upload(content), "name": name},
                                        format="multipart")
        assert response.status_code == 201, response.content


@pytest.fixture(scope="module")
def cls_pt(tmp_path_factory):
    """Real classify weights (saved by Ultralytics from yolov8n-cls.yaml, nothing downloaded)."""
    return build_checkpoint("yolov8n-cls.yaml", tmp_path_factory.mktemp("weights"), names={0: "cat", 1: "dog"})


def submit(user, command: str):
    return api_client(user).post("/api/v1/jobs/", {"task_name": "pets", "command": command}, format="json")


def refusal(response, field: str) -> str:
    assert response.status_code == 400, response.content
    return response.json()[field][0]


@pytest.mark.parametrize("command", [
    "yolo classify train data=pets model=yolov8n-cls.yaml epochs=1 imgsz=32",
    "yolo train data=pets model=yolov8n-cls.yaml epochs=1 imgsz=32",  # the task is the model's own
])
def test_a_classify_training_on_a_classification_dataset_is_accepted(bob, pets, command):
    response = submit(bob, command)
    assert response.status_code == 201, response.content
    assert Job.objects.get(pk=response.json()["id"]).spec["resolved"]["task"] == "classify"


def test_a_classify_task_with_a_detect_model_yaml_is_refused_on_the_model(bob, pets):
    problem = refusal(submit(bob, "yolo classify train data=pets model=yolov8n.yaml"), "command.model")
    assert "yolov8n.yaml builds a detect model, and the command's task is classify" in problem
    assert "yolov8n-cls.yaml" in problem


def test_a_detect_model_on_a_classification_dataset_is_refused_on_the_data(bob, pets):
    problem = refusal(submit(bob, "yolo train data=pets model=yolov8n.yaml"), "command.data")
    assert problem.startswith("dataset pets:v1 is a classification dataset (a folder of images per class, no labels); "
                              "detect jobs need box or polygon labels: train a -cls model")


def test_a_classify_model_on_a_detection_dataset_is_refused_on_the_data(bob, pets):
    problem = refusal(submit(bob, "yolo classify train data=pcb model=yolov8n-cls.yaml"), "command.data")
    assert "dataset pcb:v1 is a YOLO dataset (data.yaml, images and labels); classify jobs need a classification" \
        in problem


def test_a_classification_dataset_is_no_data_for_an_export(bob, pets, tmp_path):
    detect_pt = build_checkpoint("yolov8n.yaml", tmp_path)
    file = SimpleUploadedFile("base.pt", detect_pt.read_bytes(), content_type="application/octet-stream")
    assert api_client(bob).post("/api/v1/weights/", {"file": file}, format="multipart").status_code == 201
    problem = refusal(submit(bob, "yolo export model=base:v1 format=onnx data=pets"), "command.data")
    assert "pets:v1 is a classification dataset" in problem and "train, val and predict jobs" in problem


@pytest.fixture
def cls_weights(bob, cls_pt):
    file = SimpleUploadedFile("petnet.pt", cls_pt.read_bytes(), content_type="application/octet-stream")
    response = api_client(bob).post("/api/v1/weights/", {"file": file}, format="multipart")
    assert response.status_code == 201, response.content
    assert response.json()["task"] == "classify", "the upload's scan reads the head's task"


def test_a_val_of_classify_weights_on_a_classification_dataset_is_accepted(bob, pets, cls_weights):
    assert submit(bob, "yolo val model=petnet:v1 data=pets").status_code == 201


def test_a_val_of_classify_weights_on_a_detection_dataset_is_refused_on_the_data(bob, pets, cls_weights):
    assert "classify jobs need a classification dataset" in refusal(
        submit(bob, "yolo val model=petnet:v1 data=pcb"), "command.data")


@pytest.mark.parametrize("source", ["pets split=val", "pcb split=train"])
def test_a_predict_of_classify_weights_is_accepted_on_a_datasets_split(bob, pets, cls_weights, source):
    """A classifier's predictions are its top-5 per image (worker.model_modes.run_predict)."""
    assert submit(bob, f"yolo predict model=petnet:v1 source={source}").status_code == 201


def test_an_export_of_a_classify_model_is_verified_on_the_classification_dataset_given(bob, pets, cls_weights):
    response = submit(bob, "yolo export model=petnet:v1 format=onnx data=pets")
    assert response.status_code == 201, response.content
    resolved = Job.objects.get(pk=response.json()["id"]).spec["resolved"]
    assert resolved["export"] == [{"format": "onnx"}] and resolved["data_yaml"].startswith("datasets/")
    assert resolved["data_yaml"] == Dataset.objects.get(name="pets").yaml_key


def test_an_export_of_a_classify_version_without_data_is_verified_on_its_training_dataset(bob, pets, cls_weights):
    """As a detect version's export is: the dataset it was trained on (recorded as a training records it)."""
    ModelVersion.objects.filter(name="petnet").update(dataset=Dataset.objects.get(name="pets"))
    response = submit(bob, "yolo export model=petnet:v1 format=torchscript")
    assert response.status_code == 201, response.content
    assert Job.objects.get(pk=response.json()["id"]).spec["resolved"]["data_yaml"] == \
        Dataset.objects.get(name="pets").yaml_key


def test_an_export_of_uploaded_classify_weights_without_data_asks_for_a_dataset(bob, pets, cls_weights):
    problem = refusal(submit(bob, "yolo export model=petnet:v1 format=onnx"), "command.data")
    assert problem.startswith("is required here: the export is verified on validation images")


def test_a_classify_training_may_ask_for_an_export_after_it(bob, pets):
    """Verified on the training's own classification dataset (review22 refused it while exports were boxes only)."""
    response = api_client(bob).post("/api/v1/jobs/", {
        "task_name": "pets", "command": "yolo train data=pets model=yolov8n-cls.yaml epochs=1 imgsz=32",
        "export": ["onnx", "torchscript"]}, format="json")
    assert response.status_code == 201, response.content
    assert Job.objects.get(pk=response.json()["id"]).spec["resolved"]["export"] == [
        {"format": "onnx"}, {"format": "torchscript"}]


def registered(team, name: str, task: str, version: int = 1) -> ModelVersion:
    return ModelVersion.objects.create(team=team, name=name, version=version, task=task, size=1,
                                       weights_key=f"models/{team.slug}/{name}/v{version}/x.pt")


def test_a_training_that_would_register_another_task_under_a_name_is_refused_on_task_name(bob, teams, pets):
    """trial23: detect x:v1 then classify x:v2, and model=x:latest quietly became a classifier."""
    registered(teams["vision"], "pets", "detect")
    registered(teams["vision"], "pets", "detect", version=2)
    problem = refusal(submit(bob, "yolo classify train data=pets model=yolov8n-cls.yaml epochs=1"), "task_name")
    assert problem.startswith("registers its weights as model 'pets' of team vision, whose versions are detect models "
                              "(pets:v2, pets:v1), but this job trains classify")
    assert "Give another task_name (e.g. pets-classify)" in problem
    assert not Job.objects.exists()


def test_a_training_of_the_names_own_task_or_a_new_name_is_accepted(bob, teams, pets):
    registered(teams["vision"], "pets", "classify")
    registered(teams["robotics"], "pets-detect", "detect")  # another team's name is no concern of vision's
    assert submit(bob, "yolo classify train data=pets model=yolov8n-cls.yaml epochs=1").status_code == 201
    response = api_client(bob).post("/api/v1/jobs/", {
        "task_name": "pets-detect", "command": "yolo classify train data=pets model=yolov8n-cls.yaml epochs=2"},
        format="json")
    assert response.status_code == 201, response.content


@pytest.fixture
def shots(bob):
    response = api_client(bob).post("/api/v1/datasets/", {
        "file": upload(make_zip({"a.png": PNG, "b.png": PNG})), "name": "shots", "kind": "images"}, format="multipart")
    assert response.status_code == 201, response.content


def test_a_predict_naming_a_split_of_an_images_upload_is_refused_on_split(bob, cls_weights, shots):
    """trial23: split=val was accepted, meant nothing, and made a duplicate of the job without it."""
    problem = refusal(submit(bob, "yolo predict model=petnet:v1 source=shots split=val"), "command.split")
    assert problem.startswith("an images upload has no splits: shots:v1 is images to predict on, and a predict job "
                              "annotates all 2 of them; leave split out")
    structured = api_client(bob).post("/api/v1/jobs/", {"task_name": "p", "predict": {
        "model": "petnet:v1", "source": "shots", "split": "train"}}, format="json")
    assert "an images upload has no splits" in refusal(structured, "predict.split")
    assert submit(bob, "yolo predict model=petnet:v1 source=shots").status_code == 201
