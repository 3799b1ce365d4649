"""Classification datasets (Ultralytics' ``train/<class>/<image>`` layout): uploaded as a zip through the
dataset API (the default kind recognises the layout; ``kind=classify`` insists on it), checked before
anything is extracted, stored with a data.yaml of their splits and class names, refused naming the
folder or file that is wrong."""

from __future__ import annotations

import pytest
import yaml

from apps.datasets.models import Dataset
from tests.conftest import api_client

from .archives import PNG, jpeg, make_zip, upload, valid_files

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def storage(settings, tmp_path):
    settings.DATASETS_DIR = tmp_path / "datasets"
    return settings.DATASETS_DIR


def classification_files(classes=("cat", "dog"), splits=("train", "val"), per_class: int = 2,
                         prefix: str = "") -> dict[str, bytes]:
    return {f"{prefix}{split}/{name}/{n}.png": PNG for split in splits for name in classes for n in range(per_class)}


def post(user, content: bytes, **fields):
    return api_client(user).post("/api/v1/datasets/", {"file": upload(content), "name": "pets", **fields},
                                 format="multipart")


def problems_of(response) -> dict[str, str]:
    assert response.status_code == 400, response.content
    return {p["path"]: p["problem"] for p in response.json()["problems"]}


def test_a_classification_folder_uploaded_with_the_default_kind_becomes_a_classification_dataset(bob, storage):
    """trial21 found this refused ("classify training is not supported"); the layout alone says what it is."""
    files = classification_files(prefix="pets/") | {"pets/train/cat/2.png": PNG}
    response = post(bob, make_zip(files))
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["kind"], body["num_images"], body["num_classes"], body["names"]) == ("classify", 9, 2, ["cat", "dog"])
    dataset = Dataset.objects.get()
    assert dataset.stats["splits"] == {"train": {"images": 5, "labels": 5, "instances": 5},
                                       "val": {"images": 4, "labels": 4, "instances": 4}}
    assert dataset.stats["histogram"] == {"train": [3, 2], "val": [2, 2]}
    folder = storage / "vision" / "pets" / "v1"
    assert (folder / "train" / "cat" / "2.png").is_file(), "the single top folder is stripped, the layout kept"
    # The platform's record of the splits and classes; Ultralytics itself is given the folder.
    assert yaml.safe_load((folder / "data.yaml").read_text()) == {
        "train": "train", "val": "val", "names": {0: "cat", 1: "dog"}}


def test_class_ids_follow_ultralytics_order_of_the_sorted_train_folders(bob):
    files = classification_files(classes=("zebra", "Ant", "bee"))
    assert post(bob, make_zip(files), kind="classify").json()["names"] == ["Ant", "bee", "zebra"]


def test_a_roboflow_export_with_valid_and_test_folders_is_accepted(bob, storage):
    files = classification_files(splits=("train", "valid", "test"))
    response = post(bob, make_zip(files))
    assert response.status_code == 201, response.content
    document = yaml.safe_load((storage / "vision" / "pets" / "v1" / "data.yaml").read_text())
    assert (document["val"], document["test"]) == ("valid", "test")


def test_an_archive_without_images_is_refused(bob):
    problems = problems_of(post(bob, make_zip({"train/cat/": b"", "val/cat/": b""}), kind="classify"))
    assert problems["train/cat/"] == "holds no images: every class folder needs at least one image"


def test_a_class_folder_without_images_is_named(bob):
    files = classification_files() | {"train/bird/": b"", "val/bird/": b""}
    problems = problems_of(post(bob, make_zip(files)))
    assert set(problems) == {"train/bird/", "val/bird/"}
    assert "holds no images" in problems["train/bird/"]


def test_a_train_split_alone_is_refused_saying_val_is_missing(bob):
    response = post(bob, make_zip(classification_files(splits=("train",))))
    assert "is not a valid classification dataset" in response.json()["file"][0]
    assert problems_of(response)["val/"].startswith("is missing (Ultralytics measures accuracy on it after every epoch)")


def test_val_alone_is_refused_saying_train_is_missing(bob):
    problems = problems_of(post(bob, make_zip(classification_files(splits=("val",)))))
    assert list(problems) == ["train/"] and problems["train/"].startswith("is missing")


def test_class_folders_that_differ_between_train_and_val_are_named(bob):
    files = classification_files(classes=("cat", "dog", "owl"), splits=("train",)) | classification_files(
        classes=("cat", "dog", "yak"), splits=("val",))
    problem = problems_of(post(bob, make_zip(files)))["val/"]
    assert "has other class folders than train/ (missing from it: owl; not in train/: yak)" in problem


def test_a_single_class_is_refused(bob):
    problems = problems_of(post(bob, make_zip(classification_files(classes=("cat",)))))
    assert problems["train/"].startswith("has one class folder (cat/): a classifier learns to tell classes apart")


def test_a_yolo_export_without_data_yaml_is_not_taken_for_classes_named_images(bob):
    """train/images/… without labels or data.yaml: the YOLO answer (data.yaml missing), not a class "images"."""
    files = {f"{split}/images/{n}.png": PNG for split in ("train", "valid") for n in range(2)}
    response = post(bob, make_zip(files))
    assert response.status_code == 400 and "has no data.yaml at its top" in response.json()["file"][0]


def test_images_under_ten_pixels_a_side_are_refused_as_training_would_skip_them(bob):
    files = classification_files() | {"train/cat/small.jpg": jpeg((9, 30))}
    problem = problems_of(post(bob, make_zip(files)))["train/cat/small.jpg"]
    assert "9×30 pixels: training skips images under 10 pixels a side" in problem


def test_an_image_outside_a_class_folder_is_named_with_where_it_belongs(bob):
    files = classification_files() | {"train/loose.png": PNG}
    assert problems_of(post(bob, make_zip(files)))["train/loose.png"] == (
        "images belong in a class folder directly inside train/ (train/<class>/loose.png)")


def test_the_classify_kind_refuses_a_yolo_dataset_naming_its_files(bob):
    """Asked for a classification dataset, a data.yaml with images/ and labels/ is not silently read as one."""
    problems = problems_of(post(bob, make_zip(valid_files()), kind="classify"))
    assert problems["images/"].startswith("is not a split folder: a classification dataset holds train/ and val/")
    assert "no label files and no data.yaml" in problems["data.yaml"]


def test_a_yolo_dataset_still_uploads_as_a_yolo_dataset(bob):
    assert post(bob, make_zip(valid_files())).json()["kind"] == "yolo"


def test_its_page_shows_each_sample_with_its_class_and_the_sample_image_is_served(bob):
    from django.test import Client

    dataset_id = post(bob, make_zip(classification_files())).json()["id"]
    client = Client()
    client.force_login(bob)
    html = client.get(f"/datasets/{dataset_id}/").content.decode()
    assert '<span class="pill">classify</span>' in html and " boxes</small>" not in html
    assert "val · val/cat/0.png · class cat" in html
    sample = client.get(f"/api/v1/datasets/{dataset_id}/samples/0/")
    assert sample.status_code == 200 and b"".join(sample.streaming_content) == PNG
