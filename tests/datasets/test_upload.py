"""Dataset zip uploads: checked before extraction, extracted into the team's storage, registered."""

from __future__ import annotations

import os
import time
import zipfile
from pathlib import Path

import pytest
import yaml

from apps.accounts.models import AuditEntry
from apps.datasets.models import Dataset
from tests.conftest import api_client

from .archives import PNG, ROBOFLOW_YAML, jpeg, make_zip, roboflow_files, upload, valid_files

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def storage(settings, tmp_path):
    settings.DATASETS_DIR = tmp_path / "datasets"
    return settings.DATASETS_DIR


def post(user, content: bytes, **fields):
    return api_client(user).post("/api/v1/datasets/", {"file": upload(content), "name": "pcb", **fields},
                                 format="multipart")


def test_a_member_uploads_a_dataset_into_their_teams_storage(bob, storage):
    response = post(bob, make_zip(valid_files()), team="vision", description="scratches")
    assert response.status_code == 201, response.content
    body = response.json()
    assert {k: body[k] for k in ("team", "name", "version", "reference", "kind", "num_images", "num_classes",
                                 "names", "description")} == {
        "team": "vision", "name": "pcb", "version": 1, "reference": "pcb:v1", "kind": "yolo", "num_images": 4,
        "num_classes": 2, "names": ["scratch", "dent"], "description": "scratches"}
    assert len(body["sha256"]) == 64 and body["size_bytes"] > 0
    folder = storage / "vision" / "pcb" / "v1"
    document = yaml.safe_load((folder / "data.yaml").read_text())
    # No absolute `path`: Ultralytics takes the YAML's folder, so the version can move with the store.
    assert document == {"train": "images/train", "val": "images/val", "names": {0: "scratch", 1: "dent"}}
    assert (folder / "labels" / "val" / "1.txt").is_file()
    assert [p.name for p in (storage / "vision").iterdir()] == ["pcb"], "no staging folder left behind"
    assert Dataset.objects.get().key == "datasets/vision/pcb/v1"
    assert AuditEntry.objects.filter(action="dataset.upload", team__slug="vision").exists()


def test_a_single_top_folder_in_the_archive_is_stripped(bob, storage):
    response = post(bob, make_zip(valid_files("my-data/") | {"__MACOSX/._x": b"junk"}))
    assert response.status_code == 201, response.content
    assert (storage / "vision" / "pcb" / "v1" / "images" / "train" / "0.png").is_file()
    assert not (storage / "vision" / "pcb" / "v1" / "__MACOSX").exists()


def test_an_uploaded_dataset_can_be_trained_on_by_name(bob, storage):
    assert post(bob, make_zip(valid_files())).status_code == 201
    spec = {"task_name": "t", "command": "yolo train data=pcb model=yolov8n.yaml epochs=1"}
    response = api_client(bob).post("/api/v1/jobs/", spec, format="json")
    assert response.status_code == 201, response.content


def test_the_list_and_detail_are_scoped_to_the_callers_teams(bob, carol):
    dataset_id = post(bob, make_zip(valid_files())).json()["id"]
    assert [d["name"] for d in api_client(bob).get("/api/v1/datasets/").json()["results"]] == ["pcb"]
    assert api_client(carol).get("/api/v1/datasets/").json()["results"] == []
    assert api_client(carol).get(f"/api/v1/datasets/{dataset_id}/").status_code == 404
    assert api_client(bob).get(f"/api/v1/datasets/{dataset_id}/").status_code == 200


def test_uploading_into_another_team_is_refused_naming_the_team(carol, bob, storage):
    response = post(carol, make_zip(valid_files()), team="vision")
    assert response.status_code == 400 and "not a member" in response.json()["team"][0]
    assert not (storage / "vision").exists()


def test_uploading_a_name_again_makes_a_new_version_and_keeps_the_old_one(bob, storage):
    first = post(bob, make_zip(valid_files())).json()
    changed = valid_files() | {"labels/val/0.txt": b"1 0.5 0.5 0.3 0.3\n"}
    second = post(bob, make_zip(changed)).json()
    assert (first["version"], second["version"]) == (1, 2)
    assert first["sha256"] != second["sha256"]
    assert (storage / "vision" / "pcb" / "v1" / "data.yaml").is_file()
    assert (storage / "vision" / "pcb" / "v2" / "data.yaml").is_file()


def test_the_same_files_in_another_zip_have_the_same_hash(bob):
    first = post(bob, make_zip(valid_files())).json()
    again = post(bob, make_zip(valid_files("top/"))).json()  # so they are that version, not a new one
    assert first["sha256"] == again["sha256"] and (again["version"], again["unchanged"]) == (1, True)


@pytest.mark.parametrize("field", ["yaml_path", "yaml_key", "key", "sha256", "version", "num_images", "owner",
                                   "path"])
def test_fields_the_platform_sets_are_refused(field, bob):
    response = post(bob, make_zip(valid_files()), **{field: "/etc"})
    assert response.status_code == 400 and field in response.json()
    assert not Dataset.objects.exists()


def test_an_unknown_field_and_a_bad_known_one_are_named_together_with_the_file_on_disk(bob, settings):
    """trial25: an unknown field hid the known fields' problems; naming both must not copy the files
    (a large upload is an open temporary file, which cannot be deep-copied)."""
    settings.FILE_UPLOAD_MAX_MEMORY_SIZE = 0  # every uploaded file a TemporaryUploadedFile
    response = post(bob, make_zip(valid_files()), bogus="1", kind="segmentation")
    assert response.status_code == 400, response.content
    assert set(response.json()) == {"bogus", "kind"} and response.json()["bogus"] == ["is not a known field"]
    assert not Dataset.objects.exists()


def test_an_empty_zip_is_called_empty(bob, storage):
    """Trial25: an empty zip "has no data.yaml at its top", as if only that were missing."""
    import io

    buffer = io.BytesIO()
    zipfile.ZipFile(buffer, "w").close()
    for kind in ("yolo", "images", "classify"):
        response = post(bob, buffer.getvalue(), kind=kind)
        assert response.status_code == 400, (kind, response.content)
        assert response.json()["file"] == ["is a zip archive with nothing in it"], (kind, response.content)
    assert not Dataset.objects.exists()


def test_a_missing_file_names_the_field(bob):
    response = api_client(bob).post("/api/v1/datasets/", {"name": "x"}, format="multipart")
    assert response.status_code == 400 and "file" in response.json()


def test_an_upload_over_the_size_limit_is_refused_before_reading(bob, settings):
    settings.DATASET_UPLOAD_MAX_BYTES = 1024
    response = post(bob, make_zip(valid_files()) + b"\0" * (2 * 1024**2))
    assert response.status_code == 400 and "limit" in response.json()["file"][0]


def test_an_archive_over_the_compressed_limit_is_refused(bob, settings):
    settings.DATASET_UPLOAD_MAX_BYTES = 1024
    response = post(bob, make_zip(valid_files()) + b"\0" * 2048)
    assert response.status_code == 400 and "limit" in response.json()["file"][0]


def test_too_many_files_are_refused_before_extracting(bob, settings, storage):
    settings.DATASET_MAX_FILES = 5
    response = post(bob, make_zip(valid_files()))
    assert response.status_code == 400 and "entries" in response.json()["file"][0]
    assert not (storage / "vision").exists()


def test_label_problems_are_reported_per_file(bob):
    files = valid_files() | {"labels/train/0.txt": b"0 0.5 0.5 0.2\n", "labels/train/1.txt": b"7 0.5 0.5 0.2 0.2\n",
                             "labels/val/0.txt": b"0 1.5 0.5 0.2 0.2\n", "labels/val/1.txt": b"cat 0 0 0 0\n"}
    response = post(bob, make_zip(files))
    assert response.status_code == 400
    problems = {p["path"]: p["problem"] for p in response.json()["problems"]}
    assert "expected 'class x_center" in problems["labels/train/0.txt"]
    assert "not in data.yaml names" in problems["labels/train/1.txt"]
    assert "normalised" in problems["labels/val/0.txt"]
    assert "whole number" in problems["labels/val/1.txt"]


def test_structure_problems_are_reported(bob):
    files = {k: v for k, v in valid_files().items() if not k.startswith("images/val")}
    files["stray.png"] = b"x"
    response = post(bob, make_zip(files))
    problems = {p["path"]: p["problem"] for p in response.json()["problems"]}
    assert "not in the archive" in problems["data.yaml: val"]
    assert "'images' folder" in problems["stray.png"]


def test_a_roboflow_export_is_accepted_as_it_is_downloaded(bob, storage, monkeypatch):
    """train/images, valid/images, test/images beside a data.yaml saying ../<split>/images, and README
    .txt files at the top (trial16 G13): accepted, counted per split, and the stored data.yaml is
    one Ultralytics resolves to those folders."""
    import ultralytics.data.utils as yolo_data

    response = post(bob, make_zip(roboflow_files({"train": 5, "valid": 3, "test": 2})), name="widgets")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["num_images"] == 10 and body["names"] == ["widget", "gadget"]
    assert {split: counts["images"] for split, counts in body["stats"]["splits"].items()} == {
        "train": 5, "val": 3, "test": 2}
    assert {split: counts["labels"] for split, counts in body["stats"]["splits"].items()} == {
        "train": 5, "val": 3, "test": 2}
    folder = storage / "vision" / "widgets" / "v1"
    document = yaml.safe_load((folder / "data.yaml").read_text())
    assert document == {"train": "train/images", "val": "valid/images", "test": "test/images",
                        "names": {0: "widget", 1: "gadget"}}
    assert not list(folder.glob("README*")), "documentation is not part of the stored version"
    # What the trainer does with it: Ultralytics' own resolution (offline: no font lookup).
    monkeypatch.setattr(yolo_data, "check_font", lambda *args, **kwargs: None)
    resolved = yolo_data.check_det_dataset(str(folder / "data.yaml"), autodownload=False)
    for split, count in (("train", 5), ("val", 3), ("test", 2)):
        images = sorted(Path(resolved[split]).glob("*.jpg"))
        assert len(images) == count
        assert all(Path(label).is_file() for label in yolo_data.img2label_paths([str(i) for i in images]))
    spec = {"task_name": "t", "command": "yolo train data=widgets model=yolov8n.yaml epochs=1"}
    assert api_client(bob).post("/api/v1/jobs/", spec, format="json").status_code == 201


def test_a_roboflow_export_without_a_test_split_keeps_train_and_val(bob, storage):
    """Roboflow writes 'test: ../test/images' even when the export has no test folder."""
    response = post(bob, make_zip(roboflow_files({"train": 2, "valid": 1})), name="widgets")
    assert response.status_code == 201, response.content
    assert set(response.json()["stats"]["splits"]) == {"train", "val"}


@pytest.mark.parametrize("value", ["../../etc", "../../train/images", "../elsewhere/images", "train/../../x"])
def test_a_split_that_leaves_the_archive_is_still_refused(bob, storage, value):
    files = roboflow_files({"train": 1, "valid": 1}) | {
        "data.yaml": ROBOFLOW_YAML.replace("../train/images", value).encode()}
    response = post(bob, make_zip(files), name="widgets")
    assert response.status_code == 400
    problems = {p["path"]: p["problem"] for p in response.json()["problems"]}
    assert "outside the archive" in problems["data.yaml: train"] or "not in the archive" in problems["data.yaml: train"]
    assert not (storage / "vision" / "widgets").exists()


def test_a_stray_text_file_inside_a_folder_is_still_a_misplaced_label(bob):
    files = roboflow_files({"train": 1, "valid": 1}) | {"train/notes.txt": b"0 0.5 0.5 0.1 0.1\n"}
    problems = {p["path"]: p["problem"] for p in post(bob, make_zip(files)).json()["problems"]}
    assert "'labels' folder" in problems["train/notes.txt"]


def test_images_that_do_not_decode_are_refused_by_name(bob, storage):
    """A .jpg of text and a big .jpg of random bytes (trial16 G12): Ultralytics would skip both as
    corrupt; the upload names them, reading only their first bytes."""
    huge = os.urandom(24 * 1024**2)
    files = valid_files() | {"images/train/img003.jpg": b"not an image", "labels/train/img003.txt": b"0 .5 .5 .1 .1\n",
                             "images/train/huge.jpg": huge, "images/val/empty.png": b""}
    content = make_zip(files, compression=zipfile.ZIP_STORED)
    started = time.monotonic()
    response = post(bob, content)
    assert time.monotonic() - started < 3.0
    assert response.status_code == 400
    problems = {p["path"]: p["problem"] for p in response.json()["problems"]}
    assert set(problems) == {"images/train/img003.jpg", "images/train/huge.jpg", "images/val/empty.png"}
    assert "not a readable image" in problems["images/train/img003.jpg"]
    assert "not a readable image" in problems["images/train/huge.jpg"]
    assert "empty file" in problems["images/val/empty.png"]
    assert not (storage / "vision" / "pcb").exists() and not Dataset.objects.exists()


def test_a_real_jpeg_with_a_png_suffix_is_an_image(bob):
    """The header decides, not the suffix (Ultralytics reads it by content too)."""
    files = valid_files() | {"images/train/2.png": jpeg(), "labels/train/2.txt": b"0 0.5 0.5 0.2 0.2\n"}
    assert post(bob, make_zip(files)).status_code == 201


def test_the_image_suffixes_are_the_ones_ultralytics_trains_on():
    """An AVIF (or JPEG 2000) dataset was refused as "unexpected files" though Ultralytics trains on it,
    and a .pfm was accepted that Ultralytics no longer lists, so training would not find its images."""
    from ultralytics.data.utils import IMG_FORMATS

    from apps.datasets.archive import IMAGE_SUFFIXES

    assert IMAGE_SUFFIXES == {f".{suffix}" for suffix in IMG_FORMATS}


def test_an_avif_dataset_is_accepted(bob, storage):
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), "red").save(buffer, format="AVIF")
    files = {name.replace(".png", ".avif"): (buffer.getvalue() if name.endswith(".png") else data)
             for name, data in valid_files().items()}
    response = post(bob, make_zip(files))
    assert response.status_code == 201, response.content
    assert response.json()["num_images"] == 4
    assert (storage / "vision" / "pcb" / "v1" / "images" / "val" / "1.avif").is_file()


def test_many_unreadable_images_are_counted_and_the_list_is_capped(bob):
    files = valid_files() | {f"images/train/bad{n:03d}.jpg": b"\xff\xd8 truncated" for n in range(120)}
    body = post(bob, make_zip(files)).json()
    assert body["problem_count"] == 120
    assert len(body["problems"]) == 50
    assert all("not a readable image" in p["problem"] for p in body["problems"])


def test_an_images_only_upload_names_its_unreadable_files(bob):
    response = post(bob, make_zip({"shots/a.jpg": jpeg(), "shots/b.jpg": b"GIF89a nope"}), kind="images")
    assert response.status_code == 400
    assert [p["path"] for p in response.json()["problems"]] == ["b.jpg"]  # below the one top folder, stripped
    assert "not a readable image" in response.json()["file"][0]


def test_it_checks_in_well_under_a_second(bob):
    started = time.monotonic()
    post(bob, make_zip(valid_files() | {"../evil.txt": b"x"}))
    assert time.monotonic() - started < 2.0


def nothing_outside(storage: Path) -> bool:
    return not any(p.name.startswith(("evil", "owned")) for p in storage.parent.rglob("*"))


def test_documentation_beside_data_yaml_is_skipped_and_named_in_the_answer(bob, storage):
    """README.md, LICENSE, a PDF, an HTML page, .DS_Store and __MACOSX/ beside the dataset are what
    people zip with it: left out of the stored version, and the answer says which were."""
    files = valid_files("pcb/") | {
        "pcb/README.md": b"# PCB defects\n", "pcb/LICENSE": b"CC BY 4.0\n", "pcb/LICENSE.txt": b"CC BY 4.0\n",
        "pcb/paper.pdf": b"%PDF-1.4\n", "pcb/index.html": b"<html></html>", "pcb/.DS_Store": b"\0\0\0\1Bud1",
        "__MACOSX/pcb/._README.md": b"junk", "__MACOSX/pcb/images/train/._0.png": b"junk",
        "NOTES.md": b"beside the dataset's folder, at the archive's top\n"}
    response = post(bob, make_zip(files))
    assert response.status_code == 201, response.content
    assert response.json()["skipped"] == [
        "NOTES.md", "pcb/LICENSE", "pcb/LICENSE.txt", "pcb/README.md", "pcb/index.html", "pcb/paper.pdf",
        "pcb/.DS_Store", "__MACOSX/ (2 entries of macOS metadata)"]
    folder = storage / "vision" / "pcb" / "v1"
    assert sorted(p.name for p in folder.iterdir()) == ["data.yaml", "images", "labels"]
    again = post(bob, make_zip(files))
    assert again.status_code == 200 and again.json()["unchanged"] is True
    assert "pcb/README.md" in again.json()["skipped"]


def test_the_dataset_page_lists_what_the_upload_skipped(bob, storage, client):
    """The portal's upload goes straight to the new version's page on a 201, so the answer's
    `skipped` was never shown in a browser (a trial): the version keeps it and its page lists it."""
    files = valid_files("pcb/") | {"pcb/README.md": b"# PCB defects\n", "pcb/LICENSE": b"CC BY 4.0\n"}
    response = post(bob, make_zip(files))
    assert response.status_code == 201, response.content
    client.force_login(bob)

    page = client.get(f"/datasets/{response.json()['id']}/").content.decode()

    assert 'id="skipped"' in page and "Not stored" in page
    assert "<code>pcb/LICENSE</code>" in page and "<code>pcb/README.md</code>" in page
    plain = post(bob, make_zip(valid_files()), name="plain")
    assert 'id="skipped"' not in client.get(f"/datasets/{plain.json()['id']}/").content.decode()


def test_a_document_inside_the_datasets_folders_is_still_unexpected(bob, storage):
    files = valid_files() | {"README.md": b"# fine here\n", "images/train/README.md": b"# not here\n",
                             "labels/val/LICENSE": b"MIT\n"}
    response = post(bob, make_zip(files))
    assert response.status_code == 400
    problems = {p["path"]: p["problem"] for p in response.json()["problems"]}
    assert set(problems) == {"images/train/README.md", "labels/val/LICENSE"}
    assert problems["images/train/README.md"].startswith("unexpected file type .md: only images, .txt label files")
    assert "skipped only beside data.yaml" in problems["labels/val/LICENSE"]
    assert not (storage / "vision" / "pcb").exists()


# The first box of an iPhone photo: 'ftyp', major brand 'heic' (Pillow reads it only with a plugin).
HEIC = b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic" + b"\x00\x00\x01\x00meta" + bytes(240)


def test_heic_images_are_refused_with_what_to_do_naming_a_few(bob, storage):
    """Photos from a phone are HEIC (a .heif, or a HEIC saved as .jpg, too): one summary says how
    many, that training cannot read them, how to convert them, and names the first few."""
    files = valid_files() | {f"images/train/IMG_{n:04d}.heic": HEIC for n in range(3)} | {
        "images/val/IMG_0100.heif": HEIC, "images/val/IMG_0101.jpg": HEIC}
    response = post(bob, make_zip(files))
    assert response.status_code == 400
    body = response.json()
    assert body["file"] == [
        "is not a valid YOLO dataset (5 problems); 5 images are HEIC, which training cannot read; convert them to "
        "JPEG or PNG (e.g. `magick mogrify -format jpg *.heic`, `heif-convert IMG_0001.heic IMG_0001.jpg`, or "
        "Export… as JPEG in macOS Preview): images/train/IMG_0000.heic, images/train/IMG_0001.heic, "
        "images/train/IMG_0002.heic and 2 more"]
    assert {p["path"] for p in body["problems"]} == {
        "images/train/IMG_0000.heic", "images/train/IMG_0001.heic", "images/train/IMG_0002.heic",
        "images/val/IMG_0100.heif", "images/val/IMG_0101.jpg"}
    assert all(p["problem"].startswith("is a HEIC/HEIF image (an iPhone's photo format), which training cannot "
                                       "read: convert it to JPEG or PNG") for p in body["problems"])
    assert not (storage / "vision" / "pcb").exists()


def test_one_heic_among_images_to_predict_on_is_named(bob, storage):
    response = post(bob, make_zip({"shots/a.png": valid_files()["images/train/0.png"], "shots/b.heic": HEIC}),
                    kind="images")
    assert response.status_code == 400
    summary = response.json()["file"][0]
    assert summary.startswith("has 1 file that is not a readable image; 1 image is HEIC, which training cannot "
                              "read; convert it to JPEG or PNG")
    assert summary.endswith(": b.heic")


def test_a_data_yaml_two_folders_deep_is_named_in_the_refusal(bob, storage):
    """Zipping a parent folder (project/pcb/data.yaml) says where data.yaml was found."""
    response = post(bob, make_zip(valid_files("project/pcb/")))
    assert response.status_code == 400
    problems = {p["path"]: p["problem"] for p in response.json()["problems"]}
    assert "found project/pcb/data.yaml" in problems["data.yaml"]
    assert "upload the folder that holds data.yaml, or a zip of it" in problems["data.yaml"]


def test_a_dataset_yaml_under_another_name_is_told_to_be_data_yaml(bob, storage):
    files = {k: v for k, v in valid_files().items() if k != "data.yaml"}
    response = post(bob, make_zip(files | {"pcb_defect.yaml": valid_files()["data.yaml"]}))
    assert response.status_code == 400
    problems = {p["path"]: p["problem"] for p in response.json()["problems"]}
    assert "name it data.yaml" in problems["pcb_defect.yaml"]


@pytest.mark.parametrize("nc", ["100000000000", "0", "'3'", "true"])
def test_an_nc_out_of_range_is_named_not_reported_missing(bob, storage, nc):
    data_yaml = f"train: images/train\nval: images/val\nnc: {nc}\n".encode()
    response = post(bob, make_zip(valid_files() | {"data.yaml": data_yaml}))
    assert response.status_code == 400
    problem = {p["path"]: p["problem"] for p in response.json()["problems"]}["data.yaml: names"]
    assert problem.startswith("'nc' must be a whole number of classes from 1 to 10000, got ")


def test_a_missing_split_is_shown_with_an_example_of_its_own_name(bob, storage):
    response = post(bob, make_zip(valid_files() | {"data.yaml": b"train: images/train\nnames: [a, b]\n"}))
    problems = {p["path"]: p["problem"] for p in response.json()["problems"]}
    assert problems["data.yaml: val"] == "is required (a folder of images, e.g. images/val)"


def test_a_kind_that_is_no_kind_is_refused_naming_the_kinds(bob, storage):
    response = post(bob, make_zip(valid_files()), kind="labels")
    assert response.status_code == 400 and response.json()["kind"] == ["must be one of yolo, images, classify, got 'labels'"]


def test_images_without_a_kind_are_told_to_upload_as_images(bob, storage):
    """Trial 20: a zip of photos to predict on, sent without kind=images, read only "data.yaml: missing"."""
    response = post(bob, make_zip({f"shots/{n}.png": PNG for n in range(3)}))
    assert response.status_code == 400
    problem = {p["path"]: p["problem"] for p in response.json()["problems"]}["data.yaml"]
    assert "holds only images" in problem and "--kind images" in problem and "kind=images" in problem


def test_a_label_file_mixing_boxes_and_polygons_is_refused_by_name(bob, storage):
    """Trial 20: Ultralytics skips such a file ("labels mix segment and detection rows"), so its
    image left training with a warning in the log; the upload took it."""
    mixed = b"0 0.1 0.1 0.5 0.1 0.5 0.5\n1 0.5 0.5 0.2 0.2\n"
    response = post(bob, make_zip(valid_files() | {"labels/train/0.txt": mixed}))
    assert response.status_code == 400
    problem = {p["path"]: p["problem"] for p in response.json()["problems"]}["labels/train/0.txt"]
    assert problem.startswith("line 2 is a box and line 1 a polygon: Ultralytics skips a label file that mixes them")


def test_names_with_string_class_ids_are_taken_as_ultralytics_takes_them(bob, storage):
    """``names: {"0": cat}`` was refused as "a non-integer class id '0'"; Ultralytics'
    check_class_names turns such keys into ints, so the upload stores them as ints."""
    data_yaml = b'train: images/train\nval: images/val\nnames: {"1": dent, "0": scratch}\n'
    response = post(bob, make_zip(valid_files() | {"data.yaml": data_yaml}))
    assert response.status_code == 201, response.content
    assert response.json()["names"] == ["scratch", "dent"]
    document = yaml.safe_load((storage / "vision" / "pcb" / "v1" / "data.yaml").read_text())
    assert document["names"] == {0: "scratch", 1: "dent"}


@pytest.mark.parametrize(("names", "problem"), [
    ('{0: scratch, "0": dent}', "'names' gives class id 0 twice ('0' is the second)"),
    ('{"0": scratch, "1.5": dent}', "'names' has a non-integer class id '1.5'"),
    ('{"0": scratch, "-1": dent}', "'names' has a non-integer class id '-1'"),
    ('{"0": scratch, "one": dent}', "'names' has a non-integer class id 'one'"),
    ('{"0": scratch, "2": dent}', "'names' class ids must be 0, 1, 2, … without gaps"),
    # "must be a short name" said neither what was wrong nor how short (new-user trial 27, F7).
    (f'[scratch, {"n" * 250}]', "'names' entry 1 has 250 characters; a class name has at most 200"),
    ("[scratch, [a, b]]", "'names' entry 1 must be a class name (text), got list \"['a', 'b']\""),
    # A blank name was taken (new-user trial 27, F10): a class nobody can tell apart in a plot or a prediction.
    ('[scratch, "  "]', "'names' entry 1 is blank ('  '); a class name needs a character other than spaces"),
    ('{0: scratch, 1: ""}', "'names' entry 1 is blank (''); a class name needs a character other than spaces"),
    # Stored in the version's row: a NUL was a 500 on PostgreSQL, which stores none in JSON text (trial28 F4).
    ('[scratch, "d\\0ent"]', "'names' entry 1 holds a control character (U+0000); a class name is one line of "
                             "printable text"),
    ('[scratch, "d\\nent"]', "'names' entry 1 holds a control character (U+000A); a class name is one line of "
                             "printable text"),
])
def test_string_class_ids_that_ultralytics_would_misread_are_still_refused(bob, storage, names, problem):
    data_yaml = f"train: images/train\nval: images/val\nnames: {names}\n".encode()
    response = post(bob, make_zip(valid_files() | {"data.yaml": data_yaml}))
    assert response.status_code == 400
    assert {p["path"]: p["problem"] for p in response.json()["problems"]}["data.yaml: names"] == problem


def test_images_under_ten_pixels_a_side_are_named_as_training_would_skip_them(bob, storage):
    """They were accepted, then Ultralytics' check_image dropped them as corrupt ("image size … <10
    pixels"): each is a problem of its own, as an unreadable image is."""
    files = {k: v for k, v in valid_files().items() if k not in ("images/train/0.png", "images/val/1.png")}
    files |= {"images/train/0.jpg": jpeg((9, 40)), "images/val/1.jpg": jpeg((40, 3))}
    response = post(bob, make_zip(files))
    assert response.status_code == 400
    assert response.json()["file"][0].startswith("is not a valid YOLO dataset (2 problems)")
    assert {p["path"]: p["problem"] for p in response.json()["problems"]} == {
        "images/train/0.jpg": "is an image of 9×40 pixels: training skips images under 10 pixels a side as corrupt",
        "images/val/1.jpg": "is an image of 40×3 pixels: training skips images under 10 pixels a side as corrupt"}
    assert not Dataset.objects.exists()
    # Ten pixels a side is enough; and predict reads small images, so an images-only upload keeps them.
    files["images/train/0.jpg"], files["images/val/1.jpg"] = jpeg((10, 10)), jpeg((10, 12))
    assert post(bob, make_zip(files)).status_code == 201
    assert post(bob, make_zip({"shots/a.jpg": jpeg((4, 4))}), name="shots", kind="images").status_code == 201


# Ultralytics' own coco8.yaml, as it ships (its `download:` is a URL; others hold Python).
COCO8_YAML = """path: ../datasets/coco8 # dataset root dir
train: images/train # train images (relative to 'path') 4 images
val: images/val # val images (relative to 'path') 4 images
test: # test images (optional)
names:
  0: scratch
  1: dent
download: https://github.com/ultralytics/assets/releases/download/v0.0.0/coco8.zip
"""


def test_an_ultralytics_dataset_yaml_is_accepted_without_its_path_and_download(bob, storage):
    """coco8.yaml has `path: ../datasets/coco8` and `download:` (trial23): both were refused. The stored
    data.yaml keeps neither, so they are dropped and named in `skipped`; the splits are the archive's."""
    response = post(bob, make_zip(valid_files("coco8/") | {"coco8/data.yaml": COCO8_YAML.encode()}))
    assert response.status_code == 201, response.content
    skipped = response.json()["skipped"]
    assert skipped[0].startswith("data.yaml: download (not kept: Ultralytics would execute it")
    assert skipped[1].startswith("data.yaml: path (not kept: the splits are read inside the upload")
    document = yaml.safe_load((storage / "vision" / "pcb" / "v1" / "data.yaml").read_text())
    assert document == {"train": "images/train", "val": "images/val", "names": {0: "scratch", 1: "dent"}}
    assert response.json()["stats"]["skipped"] == skipped


def test_the_demo_generators_folder_uploads_as_it_is(bob, storage, tmp_path):
    """generate_demo_dataset writes `path: <absolute>` and demo.json beside data.yaml: zipped as it
    is, both are skipped and named, and the images and labels are stored."""
    from apps.datasets.demo import generate_demo_dataset

    folder = generate_demo_dataset(tmp_path / "shapes", train=2, val=1, imgsz=32).parent
    content = make_zip({f"shapes/{p.relative_to(folder).as_posix()}": p.read_bytes()
                        for p in folder.rglob("*") if p.is_file()})
    response = post(bob, content, name="shapes")
    assert response.status_code == 201, response.content
    assert response.json()["num_images"] == 3
    assert response.json()["skipped"] == [
        "data.yaml: path (not kept: the splits are read inside the upload, relative to data.yaml)", "shapes/demo.json"]
    assert not (storage / "vision" / "shapes" / "v1" / "demo.json").exists()


@pytest.mark.parametrize("prefix", ["", "my-data/"])
def test_an_image_list_split_says_it_is_a_list_not_a_missing_folder(bob, prefix):
    """``train: train.txt`` (Ultralytics' image-list form, as COCO's train2017.txt) beside data.yaml:
    the .txt is skipped as documentation, and the split was answered "folder 'train.txt' is not in
    the archive" though the file was there (team adoption trial 30)."""
    files = valid_files(prefix)
    files[prefix + "data.yaml"] = b"train: train.txt\nval: val.txt\nnames: [scratch, dent]\n"
    files[prefix + "train.txt"] = b"./images/train/0.png\n./images/train/1.png\n"
    files[prefix + "val.txt"] = b"./images/val/0.png\n"
    response = post(bob, make_zip(files))
    assert response.status_code == 400, response.content
    problems = {p["path"]: p["problem"] for p in response.json()["problems"]}
    assert list(problems) == ["data.yaml: train", "data.yaml: val"]
    for split, problem in zip(("train", "val"), problems.values(), strict=True):
        assert "image-list files are not accepted" in problem and f"e.g. images/{split}," in problem, problem
        assert "is not in the archive" not in problem
    assert not Dataset.objects.exists()


@pytest.mark.parametrize("name", ["_pcb", "-pcb", "My Data"])
def test_a_bad_name_is_told_the_whole_rule_and_the_form_says_it_too(bob, name):
    """"_pcb" was refused "use lowercase letters, digits, '-' and '_'" — which it was: the first
    character's rule went unsaid; the portal's Name field (pattern, no title) said only "Please match
    the requested format" (team adoption trial 30)."""
    from django.test import Client

    response = post(bob, make_zip(valid_files()), name=name)
    assert response.status_code == 400, response.content
    assert "starting with a lowercase letter or digit" in response.json()["name"][0]
    client = Client()
    client.force_login(bob)
    html = client.get("/datasets/").content.decode()
    field = html.split('id="upload-name"', 1)[1].split(">", 1)[0]
    assert 'title="lowercase letters, digits' in field and "starting with a lowercase letter or digit" in field


@pytest.mark.parametrize("prefix", ["", "my-data/"])
def test_an_absolute_split_path_is_told_the_relative_form_to_write(bob, prefix):
    """``train: /home/me/datasets/pets/images/train`` (a YAML written for one's own machine) was
    refused "absolute path (would be written outside the dataset folder)" with no word of what to
    write instead (team adoption trial 30)."""
    files = valid_files(prefix)
    files[prefix + "data.yaml"] = (b"train: /home/me/datasets/pets/images/train\n"
                                   b"val: 'C:\\Users\\me\\pets\\images\\val'\n"
                                   b"test: /srv/elsewhere/test\nnames: [scratch, dent]\n")
    response = post(bob, make_zip(files))
    assert response.status_code == 400, response.content
    problems = {p["path"]: p["problem"] for p in response.json()["problems"]}
    assert problems == {
        "data.yaml: train": "'/home/me/datasets/pets/images/train' is an absolute path (a folder on the machine the "
                            "YAML was written on); write it relative to data.yaml: train: images/train",
        "data.yaml: val": "'C:\\Users\\me\\pets\\images\\val' is an absolute path (a folder on the machine the YAML "
                          "was written on); write it relative to data.yaml: val: images/val",
        "data.yaml: test": "'/srv/elsewhere/test' is an absolute path (a folder on the machine the YAML was written "
                           "on); name a folder inside the upload, relative to data.yaml (e.g. test: images/test)",
    }
    assert not Dataset.objects.exists()


def test_a_utf16_data_yaml_is_told_its_encoding(bob):
    """A data.yaml is read again as UTF-8 by Ultralytics: UTF-16 is refused, named (it said "is not UTF-8 text")."""
    import codecs

    files = valid_files()
    files["data.yaml"] = codecs.BOM_UTF16_LE + files["data.yaml"].decode().encode("utf-16-le")
    response = post(bob, make_zip(files))
    assert response.status_code == 400, response.content
    assert {p["path"]: p["problem"] for p in response.json()["problems"]} == {
        "data.yaml": "is UTF-16 text (it starts with a UTF-16 byte-order mark); save it as UTF-8"}


def test_a_huge_label_file_of_one_repeated_line_is_refused_by_the_label_limit_not_as_a_zip_bomb(bob, storage):
    # trial31: 400,000 × one line (7 MiB, deflating ~1000:1, as `yoloq dataset push` zips it) was answered
    # "compression ratio 412:1 is above 200:1 (zip bomb?)"; a label file over the limit is never read or
    # extracted, so the label limit is the refusal that applies.
    files = valid_files() | {"labels/train/0.txt": b"0 0.5 0.5 0.1 0.1\n" * 400_000}
    response = post(bob, make_zip(files))
    assert response.status_code == 400
    body = response.json()
    assert "zip bomb" not in str(body)
    problems = {p["path"]: p["problem"] for p in body["problems"]}
    assert problems["labels/train/0.txt"] == "label file is 6.9 MiB; the limit is 1.0 MiB"
    assert not (storage / "vision").exists()


def test_a_flat_layout_is_told_once_with_the_expected_layout_examples_and_a_count(bob, storage):
    # trial31: images and their .txt side by side in train/ and val/ got one line per file (42 for 42).
    files = {"data.yaml": b"train: train\nval: val\nnames: {0: scratch, 1: dent}\n"}
    for split, count in (("train", 16), ("val", 5)):
        for n in range(count):
            files[f"{split}/{n}.png"] = PNG
            files[f"{split}/{n}.txt"] = b"0 0.5 0.5 0.2 0.2\n"
    body = post(bob, make_zip(files)).json()
    problems = {p["path"]: p["problem"] for p in body["problems"]}
    assert body["problem_count"] == 3, problems
    assert "must be inside an 'images' folder" in problems["data.yaml: train"]
    assert "must be inside an 'images' folder" in problems["data.yaml: val"]
    assert problems["train/, val/"] == (
        "42 images and label files are side by side (e.g. train/0.png, train/0.txt): put each image in "
        "images/<split>/ and its label file in labels/<split>/ (images/train/0.png, labels/train/0.txt)")


def test_a_few_misplaced_files_are_still_named_one_by_one(bob, storage):
    files = valid_files() | {"stray.png": PNG, "extra/a.png": PNG, "extra/a.txt": b"0 0.5 0.5 0.2 0.2\n"}
    problems = {p["path"]: p["problem"] for p in post(bob, make_zip(files)).json()["problems"]}
    assert "'images' folder" in problems["stray.png"] and "'images' folder" in problems["extra/a.png"]
    assert "'labels' folder" in problems["extra/a.txt"]


def test_an_upper_case_txt_over_the_label_limit_still_counts_towards_the_zip_bomb_ratios(bob, storage):
    # review32: the ratio checks leave out a .txt over the label limit as "never read or extracted"
    # (trial31), matching its suffix in any case; the structure takes only ".txt" as a label file, so a
    # labels/train/notes.TXT was neither refused by the label limit nor by the ratios: 5 MiB of zeros
    # (1000:1) unpacked into the dataset. Up to the 512 MiB member limit, from a few hundred KiB.
    files = valid_files() | {"labels/train/notes.TXT": b"\0" * (5 * 1024**2)}
    response = post(bob, make_zip(files))
    assert response.status_code == 400, response.content
    assert not (storage / "vision").exists()


def test_many_label_files_outside_a_labels_folder_and_no_misplaced_image_are_told_once(bob, storage):
    # review32: the one-line summary of misplaced files (trial31) took its second example from the
    # images when the first was a label file, and there were none: an IndexError, a 500.
    files = valid_files() | {f"annotations/train/{n}.txt": b"0 0.5 0.5 0.2 0.2\n" for n in range(4)}
    response = post(bob, make_zip(files))
    assert response.status_code == 400, response.content
    problems = {p["path"]: p["problem"] for p in response.json()["problems"]}
    assert problems["annotations/train/"].startswith(
        "4 label files are outside a 'labels' folder (e.g. annotations/train/0.txt, annotations/train/1.txt)"), problems


def test_a_val_split_without_labels_is_stored_with_a_warning_naming_the_split(bob, client):
    """fix31b: such an upload was accepted silently (stats: 0 instances) and the training on it was then
    refused; the upload's answer, the detail and the dataset page now say so at once, and it is still stored."""
    files = {name: data for name, data in valid_files().items() if not name.startswith("labels/val/")}
    response = post(bob, make_zip(files))

    assert response.status_code == 201, response.content
    warning = ("the 'val' split has no labels (2 images, none with a labelled object): a training on pcb:v1 is "
               "refused unless val=false (it validates on this split each epoch), and so is validating on it; "
               "upload the labels (labels/val/, one .txt per image) as a new version")
    assert response.json()["warnings"] == [warning]
    dataset = Dataset.objects.get()
    assert api_client(bob).get(f"/api/v1/datasets/{dataset.pk}/").json()["warnings"] == [warning]
    client.force_login(bob)
    page = client.get(f"/datasets/{dataset.pk}/").content.decode()
    assert 'id="label-warnings"' in page and "The &#x27;val&#x27; split has no labels (2 images" in page

    labelled = post(bob, make_zip(valid_files()))
    assert labelled.status_code == 201 and labelled.json()["warnings"] == []
