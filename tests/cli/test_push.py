"""yoloq dataset push / weights push against a live server: folders, zips, versions, refusals."""

from __future__ import annotations

import os
import pickle
import zipfile

import pytest

from apps.accounts.services import token_create
from apps.datasets.models import Dataset
from apps.registry.models import ModelVersion
from cli import yoloq
from tests.datasets.archives import make_zip, valid_files
from tests.registry.conftest import build_checkpoint

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def logged_in(web, alice, tmp_path, monkeypatch):
    monkeypatch.setenv("YOLOQ_CONFIG", str(tmp_path / "yoloq.json"))
    _, key = token_create(user=alice, name="cli")
    assert yoloq.main(["login", web.url, "--token", key]) == 0
    return web


def run(capsys, *argv) -> tuple[int, str, str]:
    code = yoloq.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def dataset_folder(root, name="pcb_defect"):
    folder = root / name
    for relative, data in valid_files().items():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_bytes(data)
    (folder / "labels" / "train.cache").write_bytes(b"pickled by ultralytics")
    (folder / ".DS_Store").write_bytes(b"x")
    (folder / "README.md").write_bytes(b"# PCB defects\n")  # documentation: skipped by the server, said so
    return folder


def test_a_folder_and_then_a_zip_become_two_versions(logged_in, tmp_path, capsys):
    folder = dataset_folder(tmp_path)
    code, out, err = run(capsys, "dataset", "push", str(folder), "--team", "vision")
    assert code == 0, err
    assert "Stored vision/pcb_defect:v1: 4 images (train 2, val 2), 2 classes" in out
    assert "2 hidden/cache files or folders left out" in err
    assert "Skipped (not stored): pcb_defect/README.md" in err
    archive = tmp_path / "pcb_defect.zip"
    archive.write_bytes(make_zip(valid_files() | {"labels/val/0.txt": b"1 0.5 0.5 0.2 0.2\n"}))
    code, out, _ = run(capsys, "dataset", "push", str(archive), "--team", "vision", "-q")
    assert (code, out.strip()) == (0, "pcb_defect:v2")
    assert list(Dataset.objects.filter(name="pcb_defect").order_by("version").values_list("version", flat=True)) == [1, 2]


def test_the_demo_generators_folder_pushes_as_it_is(logged_in, tmp_path, capsys):
    """generate_demo_dataset's folder (data.yaml with an absolute `path`, demo.json beside it) was
    refused (trial23): it is stored, and what was left out is said."""
    from apps.datasets.demo import generate_demo_dataset

    folder = generate_demo_dataset(tmp_path / "shapes", train=2, val=1, imgsz=32).parent
    code, out, err = run(capsys, "dataset", "push", str(folder), "--team", "vision")
    assert code == 0, err
    assert "Stored vision/shapes:v1: 3 images (train 2, val 1), 3 classes" in out
    assert "Skipped (not stored): data.yaml: path (not kept: " in err and "shapes/demo.json" in err


def test_pushing_an_unchanged_folder_again_makes_no_version(logged_in, tmp_path, capsys):
    folder = dataset_folder(tmp_path)
    assert run(capsys, "dataset", "push", str(folder), "--team", "vision")[0] == 0
    (folder / "labels" / "val.cache").write_bytes(b"a new cache file: left out, so not a change")
    code, out, err = run(capsys, "dataset", "push", str(folder), "--team", "vision")
    assert code == 0, err
    assert "Unchanged: vision/pcb_defect:v1 already holds exactly these files" in out
    assert list(Dataset.objects.filter(team__slug="vision", name="pcb_defect").values_list("version", flat=True)) == [1]


def test_an_images_only_push_advises_predicting_on_it_not_training(logged_in, tmp_path, capsys):
    folder = tmp_path / "shots"
    for relative, data in valid_files().items():
        if relative.startswith("images/"):
            (folder / relative).parent.mkdir(parents=True, exist_ok=True)
            (folder / relative).write_bytes(data)
    code, out, err = run(capsys, "dataset", "push", str(folder), "--team", "vision", "--kind", "images")
    assert code == 0, err
    assert "Stored vision/shots:v1: 4 images without labels" in out
    assert "predict on it: yolo predict model=<model> source=shots" in out and "source=shots:v1" in out
    assert "yolo train" not in out and "classes" not in out


def test_a_classification_folder_push_stores_it_and_says_to_train_a_cls_model_on_it(logged_in, tmp_path, capsys):
    """The default kind takes Ultralytics' train/<class>/ layout (trial21: it was refused)."""
    from apps.datasets.demo import generate_demo_classification_dataset

    folder = generate_demo_classification_dataset(tmp_path / "shapes", train=2, val=1, imgsz=16)
    (folder / "train" / "circle.cache").write_bytes(b"pickled by ultralytics")  # left out, as for detect
    code, out, err = run(capsys, "dataset", "push", str(folder), "--team", "vision")
    assert code == 0, err
    assert "Stored vision/shapes:v1: 9 images (train 6, val 3), 3 classes" in out
    assert "a classification dataset: yolo classify train data=shapes model=yolov8n-cls.yaml" in out
    assert Dataset.objects.get(name="shapes").kind == "classify"


def test_a_refused_classification_folder_names_the_class_that_is_missing(logged_in, tmp_path, capsys):
    from apps.datasets.demo import generate_demo_classification_dataset

    folder = generate_demo_classification_dataset(tmp_path / "shapes", train=2, val=1, imgsz=16)
    for image in (folder / "val" / "triangle").iterdir():
        image.unlink()
    (folder / "val" / "triangle").rmdir()
    code, _, err = run(capsys, "dataset", "push", str(folder), "--team", "vision")
    assert code == 1 and "val/: has other class folders than train/ (missing from it: triangle)" in err


def test_a_refused_dataset_prints_each_problem(logged_in, tmp_path, capsys):
    archive = tmp_path / "bad.zip"
    archive.write_bytes(make_zip(valid_files() | {"labels/train/0.txt": b"7 0.5 0.5 0.2 0.2\n"}))
    code, _, err = run(capsys, "dataset", "push", str(archive), "--team", "vision")
    assert code == 1 and "labels/train/0.txt: line 1: class id 7 is not in data.yaml names" in err
    # A folder's refusal names the folder, not the temporary zip made of it (trial26: "other.zip was refused").
    folder = dataset_folder(tmp_path)
    (folder / "labels" / "train" / "0.txt").write_bytes(b"7 0.5 0.5 0.2 0.2\n")
    code, _, err = run(capsys, "dataset", "push", str(folder), "--team", "vision", "--name", "other")
    assert code == 1 and f"yoloq: {folder} was refused:" in err and "other.zip" not in err, err


def test_a_folder_with_an_empty_split_is_told_the_split_holds_no_images(logged_in, tmp_path, capsys):
    """Trial 31: a folder whose images/val is there but empty was refused "folder 'images/val' is not in the
    archive" (the zip left empty folders out): the user looked at the folder on disk and saw it there."""
    folder = dataset_folder(tmp_path)
    for path in (folder / "images" / "val").iterdir():
        path.unlink()
    for path in (folder / "labels" / "val").iterdir():
        path.unlink()
    code, _, err = run(capsys, "dataset", "push", str(folder), "--team", "vision")
    assert code == 1 and "data.yaml: val: folder 'images/val' holds no images" in err, err


def test_a_folder_whose_val_split_has_no_labels_is_stored_with_a_warning(logged_in, tmp_path, capsys):
    """fix31b left: such a push was stored silently, and the training on it refused later."""
    folder = dataset_folder(tmp_path)
    for path in (folder / "labels" / "val").iterdir():
        path.unlink()
    code, out, err = run(capsys, "dataset", "push", str(folder), "--team", "vision")
    assert code == 0 and "Stored vision/pcb_defect:v1" in out, (out, err)
    assert "Warning: the 'val' split has no labels (2 images, none with a labelled object): a training on " \
           "pcb_defect:v1 is refused unless val=false" in err, err


def test_weights_push_stores_a_checked_version(logged_in, tmp_path, capsys):
    weights = build_checkpoint("yolov8n.yaml", tmp_path)
    code, out, err = run(capsys, "weights", "push", str(weights), "--team", "vision", "--name", "yolov8s.pt")
    assert code == 0, err
    assert "Stored yolov8s.pt for vision as yolov8s:v1 (detect" in out
    assert ModelVersion.objects.get().filename == "yolov8s.pt"


def test_weights_push_with_folders_in_its_name_is_refused_naming_name(logged_in, tmp_path, capsys):
    weights = build_checkpoint("yolov8n.yaml", tmp_path)
    code, out, err = run(capsys, "weights", "push", str(weights), "--team", "vision", "--name", "../../x.pt")
    assert code == 1 and "name: the file name must be a plain name" in err, (out, err)
    assert "model=../../x.pt" not in out and not ModelVersion.objects.exists()


def test_weights_push_of_the_same_file_again_makes_no_version(logged_in, tmp_path, capsys):
    weights = build_checkpoint("yolov8n.yaml", tmp_path)
    assert run(capsys, "weights", "push", str(weights), "--team", "vision", "--name", "mybase.pt")[0] == 0
    code, out, err = run(capsys, "weights", "push", str(weights), "--team", "vision", "--name", "mybase.pt")
    assert code == 0, err
    assert "Unchanged: vision/mybase:v1 already holds these weights" in out
    assert list(ModelVersion.objects.values_list("version", flat=True)) == [1]


def test_weights_push_of_a_pickle_that_runs_code_names_the_global(logged_in, tmp_path, capsys):
    class Boom:
        def __reduce__(self):
            return os.system, ("true",)

    evil = tmp_path / "evil.pt"
    with zipfile.ZipFile(evil, "w") as archive:
        archive.writestr("evil/data.pkl", pickle.dumps({"model": Boom()}, protocol=4))
    code, _, err = run(capsys, "weights", "push", str(evil), "--team", "vision")
    assert code == 1 and "posix.system" in err and not ModelVersion.objects.exists()


def test_a_push_to_a_team_you_are_not_in_is_refused_before_zipping(logged_in, tmp_path, capsys, monkeypatch):
    """trial23: the whole folder was zipped and sent before the server said "not a member"."""
    monkeypatch.setattr(yoloq, "zip_folder", lambda *a: pytest.fail("zipped before the team was checked"))
    monkeypatch.setattr(yoloq, "upload", lambda *a: pytest.fail("sent before the team was checked"))
    folder = dataset_folder(tmp_path)
    code, _, err = run(capsys, "dataset", "push", str(folder), "--team", "robotics")
    assert code == 1
    assert "team: you are not a member of a team named 'robotics' (your teams: vision); nothing was uploaded" in err
    weights = tmp_path / "w.pt"
    weights.write_bytes(b"never read")
    code, _, err = run(capsys, "weights", "push", str(weights), "--team", "robotics")
    assert code == 1 and "not a member of a team named 'robotics'" in err
    assert not Dataset.objects.filter(name="pcb_defect").exists() and not ModelVersion.objects.filter(name="w").exists()


def test_a_bad_name_a_file_that_is_no_zip_and_an_empty_folder_are_refused_before_sending(
        logged_in, tmp_path, capsys, monkeypatch):
    """trial25: each was zipped and sent, and refused by the server only then."""
    monkeypatch.setattr(yoloq, "zip_folder", lambda *a: pytest.fail("zipped"))
    monkeypatch.setattr(yoloq, "upload", lambda *a: pytest.fail("sent"))
    before = Dataset.objects.count()
    folder = dataset_folder(tmp_path)
    code, _, err = run(capsys, "dataset", "push", str(folder), "--team", "vision", "--name", "Bad Name")
    assert code == 1 and "name: 'Bad Name' is no dataset name: use lowercase letters" in err
    assert "nothing was uploaded" in err
    spec = tmp_path / "job.yaml"
    spec.write_text("task_name: x\n")
    code, _, err = run(capsys, "dataset", "push", str(spec), "--team", "vision")
    assert code == 1 and f"{spec}: is not a zip archive: push the dataset's folder, or a .zip of it" in err
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    code, _, err = run(capsys, "dataset", "push", str(tmp_path / "empty"), "--team", "vision")
    assert code == 1 and "the folder holds no files; nothing was uploaded" in err
    assert Dataset.objects.count() == before


def test_weights_push_refuses_a_bad_file_name_and_a_file_that_is_no_checkpoint_before_sending(
        logged_in, tmp_path, capsys, monkeypatch):
    """trial26: "My Base.pt", best.pth and a text file were each sent whole, then refused by the server."""
    monkeypatch.setattr(yoloq, "upload", lambda *a: pytest.fail("sent"))
    weights = build_checkpoint("yolov8n.yaml", tmp_path)
    spaced = tmp_path / "My Base.pt"
    spaced.write_bytes(weights.read_bytes())
    code, _, err = run(capsys, "weights", "push", str(spaced), "--team", "vision")
    assert code == 1 and "file: the file name must be a plain name ending in .pt" in err, err
    assert "'My Base.pt'" in err and "nothing was uploaded" in err
    code, _, err = run(capsys, "weights", "push", str(weights), "--team", "vision", "--name", "best.pth")
    assert code == 1 and "name: the file name must be a plain name ending in .pt" in err, err
    text = tmp_path / "notes.pt"
    text.write_text("hello\n")
    code, _, err = run(capsys, "weights", "push", str(text), "--team", "vision")
    assert code == 1 and f"file: {text} is not a PyTorch checkpoint (torch.save writes a zip archive)" in err, err
    assert not ModelVersion.objects.exists()
