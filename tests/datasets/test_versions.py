"""Datasets as (team, name, version): what a job records, old versions, statistics, images-only uploads,
the storage quota, and the page."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from apps.accounts.models import StorageCharge
from apps.datasets.models import Dataset
from apps.datasets.services import dataset_delete
from apps.jobs.models import Job
from tests.conftest import SEED_SPEC, api_client

from .archives import PNG, make_zip, upload, valid_files

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def storage(settings, tmp_path):
    settings.DATASETS_DIR = tmp_path / "datasets"
    return settings.DATASETS_DIR


def post(user, content: bytes, name: str = "pcb_defect", **fields):
    return api_client(user).post("/api/v1/datasets/", {"file": upload(content), "name": name, **fields},
                                 format="multipart")


def submit(user, data: str):
    spec = SEED_SPEC.replace("data=demo", f"data={data}")
    return api_client(user).post("/api/v1/jobs/", spec, content_type="application/yaml")


@pytest.mark.parametrize("reference", ["pcb_defect", "pcb_defect.yaml", "pcb_defect.yml", "pcb_defect:latest"])
def test_a_job_names_the_newest_version_with_or_without_the_yaml_suffix(reference, bob):
    post(bob, make_zip(valid_files()))
    newest = post(bob, make_zip(valid_files() | {"labels/val/0.txt": b"1 0.5 0.5 0.1 0.1\n"})).json()
    response = submit(bob, reference)
    assert response.status_code == 201, response.content
    recorded = Job.objects.get().spec["inputs"]["data"]
    assert recorded == {"id": newest["id"], "team": "vision", "name": "pcb_defect", "version": 2,
                        "sha256": newest["sha256"], "kind": "yolo"}
    assert Job.objects.get().spec["resolved"]["data_yaml"] == "datasets/vision/pcb_defect/v2/data.yaml"


def test_an_old_version_stays_usable_by_its_number(bob):
    first = post(bob, make_zip(valid_files())).json()
    post(bob, make_zip(valid_files() | {"labels/val/0.txt": b"1 0.5 0.5 0.1 0.1\n"}))
    assert submit(bob, "pcb_defect:v1").status_code == 201
    assert Job.objects.get().spec["inputs"]["data"]["sha256"] == first["sha256"]
    response = submit(bob, "pcb_defect:v7")
    assert response.status_code == 400 and "has no version 7 (it has v1, v2)" in response.json()["command.data"][0]



@pytest.mark.parametrize("number", ["0", "00", "99999999999999999999", "4294967296"])
def test_a_version_no_dataset_can_have_is_a_400_naming_data(number, bob):
    """v0 was read as "the newest" (0 is falsy), and a number past the column's integers was an
    OverflowError from the database: a 500 for any member (sec19, F7)."""
    post(bob, make_zip(valid_files()))
    response = submit(bob, f"pcb_defect:v{number}")
    assert response.status_code == 400, response.content
    assert f"has no version {number} (it has v1)" in response.json()["command.data"][0]
    assert not Job.objects.exists()


def test_the_same_files_again_are_the_newest_version_not_a_new_one(bob, carol, storage):
    first = post(bob, make_zip(valid_files()))
    assert first.status_code == 201
    charged = list(StorageCharge.objects.values_list("key", "bytes"))
    again = post(bob, make_zip(valid_files()), description="a second try")
    assert again.status_code == 200, again.content
    body = again.json()
    assert body["unchanged"] is True and (body["id"], body["version"]) == (first.json()["id"], 1)
    assert Dataset.objects.count() == 1 and "unchanged" not in first.json()
    assert list(StorageCharge.objects.values_list("key", "bytes")) == charged, "nothing more charged"
    assert sorted(p.name for p in (storage / "vision").iterdir()) == ["pcb_defect"], "no staging left"
    assert sorted(p.name for p in (storage / "vision" / "pcb_defect").iterdir()) == ["v1"]
    changed = make_zip(valid_files() | {"labels/val/0.txt": b"1 0.5 0.5 0.1 0.1\n"})
    assert post(bob, changed).json()["version"] == 2
    # Only the newest version counts: v1's files again, after v2, are a new version.
    back = post(bob, make_zip(valid_files()))
    assert back.status_code == 201 and back.json()["version"] == 3
    assert back.json()["sha256"] == first.json()["sha256"]
    # Another team's identical files are its own first version.
    other = post(carol, make_zip(valid_files()))
    assert other.status_code == 201 and other.json()["team"] == "robotics" and other.json()["version"] == 1


def test_the_api_shows_the_histogram_and_samples_with_their_boxes(bob):
    body = post(bob, make_zip(valid_files())).json()
    stats = body["stats"]
    assert stats["splits"] == {"train": {"images": 2, "labels": 2, "instances": 4},
                               "val": {"images": 2, "labels": 2, "instances": 4}}
    assert stats["histogram"] == {"train": [2, 2], "val": [2, 2]}
    assert [s["split"] for s in stats["samples"]] == ["val", "val"]
    assert stats["samples"][0]["boxes"] == [[0, 0.5, 0.5, 0.2, 0.2], [1, 0.1, 0.1, 0.05, 0.05]]


def test_a_sample_image_is_served_as_an_image_to_the_team_only(bob, carol):
    dataset = post(bob, make_zip(valid_files())).json()
    response = api_client(bob).get(f"/api/v1/datasets/{dataset['id']}/samples/1/")
    assert response.status_code == 200 and response["Content-Type"] == "image/png"
    assert b"".join(response.streaming_content) == PNG
    assert api_client(carol).get(f"/api/v1/datasets/{dataset['id']}/samples/1/").status_code == 404
    assert api_client(bob).get(f"/api/v1/datasets/{dataset['id']}/samples/9/").status_code == 404


def test_images_without_labels_upload_as_a_predict_source_only(bob):
    content = make_zip({"shots/a.png": PNG, "shots/b/c.png": PNG})
    response = post(bob, content, name="shots", kind="images")
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["kind"], body["num_images"], body["names"]) == ("images", 2, [])
    response = submit(bob, "shots")
    assert response.status_code == 400 and "only predict jobs" in response.json()["command.data"][0]
    refused = post(bob, make_zip({"a.png": PNG, "notes.txt": b"x"}), name="more", kind="images")
    assert refused.status_code == 400 and refused.json()["problems"][0]["path"] == "notes.txt"


def test_an_upload_of_another_kind_under_a_dataset_name_is_refused_naming_name(bob, storage):
    # trial25 F7: images pushed as --name rects (a YOLO dataset) became rects:v4, and data=rects failed everywhere.
    assert post(bob, make_zip(valid_files()), name="rects").status_code == 201
    charged = list(StorageCharge.objects.values_list("bytes", flat=True))

    response = post(bob, make_zip({"a.png": PNG, "b.png": PNG}), name="rects", kind="images")
    assert response.status_code == 400, response.content
    message = ("rects's versions (newest rects:v1) are YOLO datasets (data.yaml, images and labels), and this "
               "upload is images to predict on: a name's versions are one kind, so that data=rects never switches kind. "
               "Give it another name (e.g. rects-images)")
    assert response.json() == {"name": [message], "problems": [], "problem_count": 0}
    assert list(Dataset.objects.values_list("name", "version", "kind")) == [("rects", 1, "yolo")]
    assert list(StorageCharge.objects.values_list("bytes", flat=True)) == charged
    assert sorted(p.name for p in (storage / "vision").iterdir()) == ["rects"]
    assert submit(bob, "rects").status_code == 201

    assert post(bob, make_zip({"a.png": PNG, "b.png": PNG}), name="rects-images", kind="images").status_code == 201


def test_two_uploads_of_different_kinds_under_a_new_name_cannot_both_be_stored(bob, storage, monkeypatch):
    """The check before extracting saw no version yet for either; the one made with the number is decisive."""
    from apps.datasets import services

    real = services.archive_extract

    def extract_while_a_yolo_upload_lands(*args, **kwargs):
        monkeypatch.setattr(services, "archive_extract", real)
        assert post(bob, make_zip(valid_files()), name="rects").status_code == 201
        return real(*args, **kwargs)

    monkeypatch.setattr(services, "archive_extract", extract_while_a_yolo_upload_lands)
    response = post(bob, make_zip({"a.png": PNG, "b.png": PNG}), name="rects", kind="images")
    assert response.status_code == 400, response.content
    assert response.json()["name"][0].startswith("rects's versions (newest rects:v1) are YOLO datasets")
    assert list(Dataset.objects.values_list("name", "version", "kind")) == [("rects", 1, "yolo")]
    assert StorageCharge.objects.count() == 1
    assert sorted(p.name for p in (storage / "vision").iterdir()) == ["rects"]
    assert sorted(p.name for p in (storage / "vision" / "rects").iterdir()) == ["v1"]


def test_the_storage_quota_counts_every_version_and_a_delete_gives_it_back(bob, alice, teams, storage):
    first = post(bob, make_zip(valid_files())).json()
    teams["vision"].storage_quota_gb = 1.5 * first["size_bytes"] / 1024**3
    teams["vision"].save()
    refused = post(bob, make_zip(valid_files()))
    assert refused.status_code == 400 and "storage quota" in refused.json()["file"][0]
    assert not [p for p in (storage / "vision").iterdir() if p.name.startswith(".")], "no staging left"
    dataset_delete(dataset=Dataset.objects.get(), by=alice)
    assert not StorageCharge.objects.exists() and not (storage / "vision" / "pcb_defect").exists()
    again = post(bob, make_zip(valid_files()))
    assert again.status_code == 201 and again.json()["version"] == 2, "a deleted version's number is not reused"


def test_a_manager_deletes_a_version_and_a_member_may_not(bob, alice):
    dataset = post(bob, make_zip(valid_files())).json()
    assert api_client(bob).delete(f"/api/v1/datasets/{dataset['id']}/").status_code == 403
    assert api_client(alice).delete(f"/api/v1/datasets/{dataset['id']}/").status_code == 204
    assert submit(bob, "pcb_defect").status_code == 400


def test_a_manager_deletes_a_version_from_its_page_and_a_member_sees_no_button(bob, alice):
    """The page computed can_delete but showed no button: a team lead could delete a version only
    through the API (a trial)."""
    dataset = post(bob, make_zip(valid_files())).json()
    member, manager = Client(), Client()
    member.force_login(bob)
    manager.force_login(alice)
    page = f"/datasets/{dataset['id']}/"
    assert 'id="dataset-delete"' not in member.get(page).content.decode()
    assert 'id="dataset-delete"' in manager.get(page).content.decode()

    refused = member.post(f"{page}delete/", follow=True)
    assert "Only a manager of the team may delete a dataset version." in refused.content.decode()
    assert Dataset.objects.filter(pk=dataset["id"]).exists()
    job = submit(bob, "pcb_defect").json()  # queued: an active job reads it
    in_use = manager.post(f"{page}delete/", follow=True)
    assert "pcb_defect:v1 was not deleted:" in in_use.content.decode()
    Job.objects.filter(pk=job["id"]).update(state="cancelled")

    response = manager.post(f"{page}delete/")

    assert response.status_code == 302 and response["Location"] == "/datasets/"
    assert not Dataset.objects.filter(pk=dataset["id"]).exists()
    assert "Deleted pcb_defect:v1" in manager.get("/datasets/").content.decode()


def test_a_job_page_names_a_deleted_input_version_without_linking_to_a_404(bob, alice):
    """After a version was deleted, the job page of a job that trained on it still linked to its page,
    a 404 (a trial)."""
    dataset = post(bob, make_zip(valid_files())).json()
    job = submit(bob, "pcb_defect").json()
    Job.objects.filter(pk=job["id"]).update(state="cancelled")
    client = Client()
    client.force_login(bob)
    assert f'href="/datasets/{dataset["id"]}/"' in client.get(f"/jobs/{job['id']}/").content.decode()
    dataset_delete(dataset=Dataset.objects.get(pk=dataset["id"]), by=alice)

    html = client.get(f"/jobs/{job['id']}/").content.decode()

    assert f'href="/datasets/{dataset["id"]}/"' not in html
    assert 'pcb_defect:v1 <span class="muted" id="dataset-gone">(deleted)</span>' in html


def test_the_dataset_page_shows_counts_names_histogram_and_boxes(bob):
    dataset = post(bob, make_zip(valid_files())).json()
    client = Client()
    client.force_login(bob)
    html = client.get(f"/datasets/{dataset['id']}/").content.decode()
    assert 'id="image-count">4<' in html and "0: scratch" in html and "1: dent" in html
    assert html.count("<rect") == 4 and 'data-classes="2"' in html
    assert client.get("/datasets/").content.decode().count('id="dataset-') == 1


def test_a_registered_folder_is_refused_outside_the_data_store(teams, tmp_path):
    from apps.datasets.services import dataset_register

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "data.yaml").write_text("train: images\nval: images\nnames: [a]\n")
    with pytest.raises(ValueError, match="not inside any artifact root"):
        dataset_register(team=teams["vision"], name="x", yaml_path=outside / "data.yaml")


def test_an_unknown_dataset_suggests_the_closest_names_and_lists_a_few(bob, teams):
    """Trial 20: the 400 listed every dataset of the team (25 in the trial's), a typo to be spotted among them."""
    for name in ["pcb_defect", *(f"set{n:02d}" for n in range(14))]:
        Dataset.objects.create(team=teams["vision"], name=name, key=f"datasets/vision/{name}/v1",
                               yaml_key=f"datasets/vision/{name}/v1/data.yaml")

    response = submit(bob, "pcb_defcet")

    assert response.status_code == 400
    assert response.json()["command.data"] == [
        "unknown dataset 'pcb_defcet' (your team has: pcb_defect, set00, set01, set02, set03, set04, set05, set06, "
        "set07, set08 and 5 more); did you mean pcb_defect?"]


def test_a_registered_yaml_with_string_class_ids_lists_its_names_in_class_id_order(teams):
    """``names: {"0": a, …, "10": k}`` came out "0", "1", "10", "2", …: sorted as strings."""
    from apps.datasets.demo import generate_demo_dataset
    from apps.datasets.selectors import team_dataset_root
    from apps.datasets.services import dataset_register

    yaml_path = generate_demo_dataset(team_dataset_root(teams["vision"]) / "many", train=2, val=1, imgsz=64, seed=1)
    letters = "abcdefghijk"
    yaml_path.write_text("train: images/train\nval: images/val\nnames:\n"
                         + "".join(f'  "{n}": {letters[n]}\n' for n in range(11)))
    dataset = dataset_register(team=teams["vision"], name="many", yaml_path=yaml_path)
    assert dataset.names == list(letters)


def test_a_registered_yaml_under_a_classification_name_is_refused_as_an_upload_is(bob, teams):
    """dataset_register (demo_setup's, an operator's copy) made a YOLO version of a name whose versions are
    classification datasets, the switch an upload is refused (data=NAME then fails every training)."""
    from apps.datasets.demo import generate_demo_dataset
    from apps.datasets.selectors import team_dataset_root
    from apps.datasets.services import dataset_register

    from .test_classify_upload import classification_files

    assert post(bob, make_zip(classification_files()), name="shapes").status_code == 201
    yaml_path = generate_demo_dataset(team_dataset_root(teams["vision"]) / "copy", train=2, val=1, imgsz=64, seed=1)
    with pytest.raises(ValueError, match=r"shapes's versions \(newest shapes:v1\) are classification datasets"):
        dataset_register(team=teams["vision"], name="shapes", yaml_path=yaml_path)
    assert list(Dataset.objects.values_list("name", "version", "kind")) == [("shapes", 1, "classify")]


def test_a_registered_yaml_may_take_an_images_name_as_an_upload_may(bob, teams):
    from apps.datasets.demo import generate_demo_dataset
    from apps.datasets.selectors import team_dataset_root
    from apps.datasets.services import dataset_register

    assert post(bob, make_zip({"a.png": PNG, "b.png": PNG}), name="shots", kind="images").status_code == 201
    yaml_path = generate_demo_dataset(team_dataset_root(teams["vision"]) / "copy", train=2, val=1, imgsz=64, seed=1)
    assert dataset_register(team=teams["vision"], name="shots", yaml_path=yaml_path).version == 2


def test_a_small_upload_over_a_full_quota_says_how_big_it_is(bob, teams):
    """A team at its quota pushing a small dataset was told "keeps 1.00 GiB of uploads; 0.0 MiB more
    would pass its storage quota": every size under 50 KiB read 0.0 MiB (team adoption trial 30)."""
    teams["vision"].storage_quota_gb = 1
    teams["vision"].save()
    StorageCharge.objects.create(team=teams["vision"], key="datasets/vision/old/v1", bytes=1024**3)
    refused = post(bob, make_zip(valid_files()))
    assert refused.status_code == 400, refused.content
    message = refused.json()["file"][0]
    assert "keeps 1.00 GiB of uploads" in message and "quota of 1.00 GiB" in message, message
    assert "0.0 MiB" not in message, message
    assert re.search(r"; \d+(\.\d)? (B|KiB) more would pass", message), message
