"""A registry name's versions are one task, whoever registers them and in whatever order: so that
``model=NAME:latest`` never switches task (trial23). The submit check (test_classify_submit) only
refuses early what the registry already knows; the registration is the guarantee."""

from __future__ import annotations

import io
import threading

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command
from django.db import connection, transaction

from apps.jobs.models import JobEvent
from apps.registry.models import ModelVersion
from apps.registry.services import NameOfAnotherTask, model_register, version_number_claim
from tests.conftest import api_client
from tests.datasets.archives import PNG, make_zip, upload
from tests.registry.conftest import finish_training, train

pytestmark = pytest.mark.usefixtures("stores")


@pytest.fixture
def pets(bob):
    """The vision team's classification dataset (cat, dog)."""
    files = {f"{split}/{name}/{n}.png": PNG for split in ("train", "val") for name in ("cat", "dog") for n in range(2)}
    response = api_client(bob).post("/api/v1/datasets/", {"file": upload(make_zip(files)), "name": "pets"},
                                    format="multipart")
    assert response.status_code == 201, response.content


def registered(team, name: str, task: str, version: int = 1) -> ModelVersion:
    return ModelVersion.objects.create(team=team, name=name, version=version, task=task, size=1,
                                       weights_key=f"models/{team.slug}/{name}/v{version}/x.pt")


DETECT = "yolo train data=demo model=yolov8n.yaml epochs=1"
CLASSIFY = "yolo classify train data=pets model=yolov8n-cls.yaml epochs=1 imgsz=32"


@pytest.mark.django_db
def test_a_training_whose_new_name_another_tasks_training_registered_first_registers_as_name_task(
        bob, demo_registered, pets):
    """Queued one after the other under a name with no version yet, both pass the submit check; the
    later to finish keeps its weights under NAME-TASK and its outcome says why."""
    detect, classify = train(bob, DETECT, "pcb"), train(bob, CLASSIFY, "pcb")
    assert finish_training(detect).reference == "pcb:v1"
    version = finish_training(classify, b"classifier")
    assert (version.reference, version.task) == ("pcb-classify:v1", "classify")
    assert version.lineage["name_taken"] == {"name": "pcb", "task": "detect", "versions": ["pcb:v1"]}
    assert set(ModelVersion.objects.filter(name="pcb").values_list("task", flat=True)) == {"detect"}
    said = JobEvent.objects.get(job=classify, kind="succeeded").message
    assert "registered as vision/pcb-classify:v1 (not as pcb: pcb's versions are detect models (pcb:v1) and a " \
           "name's versions are one task, so that pcb:latest never switches task; this classify model is " \
           "pcb-classify:v1 (task_name pcb-classify adds to it))" in said


@pytest.mark.django_db
def test_a_training_of_the_names_own_task_takes_its_next_version(bob, demo_registered):
    registered(bob.memberships.first().team, "pcb", "detect")
    version = finish_training(train(bob, DETECT, "pcb"))
    assert version.reference == "pcb:v2" and "name_taken" not in version.lineage


@pytest.mark.django_db
def test_a_fallback_name_of_another_task_too_takes_the_next_fallback(bob, teams, demo_registered):
    job = train(bob, DETECT, "pcb")
    registered(teams["vision"], "pcb", "classify")
    registered(teams["vision"], "pcb-detect", "segment")
    assert finish_training(job).reference == "pcb-detect-2:v1"


@pytest.mark.django_db(transaction=True)
def test_two_registrations_of_one_name_at_once_pass_one_at_a_time(bob, teams, demo_registered):
    """The name's counter row is held from the number's claim to the commit: a registration of
    another task that arrives meanwhile waits, then sees the first one's version."""
    job = train(bob, DETECT, "pcb")
    claimed, release, outcome = threading.Event(), threading.Event(), {}

    def first() -> None:
        try:
            with transaction.atomic():
                number = version_number_claim(team=teams["vision"], name="pcb", task="classify")
                claimed.set()
                release.wait(10)
                ModelVersion.objects.create(team=teams["vision"], name="pcb", version=number, task="classify",
                                            weights_key="models/vision/pcb/v1/x.pt")
        finally:
            connection.close()

    def second() -> None:
        try:
            weights = job.run_dir / "best.pt"
            weights.parent.mkdir(parents=True, exist_ok=True)
            weights.write_bytes(b"detector")
            outcome["version"] = model_register(job=job, weights=weights, metrics={})
        finally:
            connection.close()

    threads = [threading.Thread(target=first)]
    threads[0].start()
    assert claimed.wait(10)
    threads.append(threading.Thread(target=second))
    threads[1].start()
    threads[1].join(0.5)
    assert threads[1].is_alive(), "the second registration waits for the first one's transaction"
    release.set()
    for thread in threads:
        thread.join(30)
    assert outcome["version"].reference == "pcb-detect:v1"
    assert outcome["version"].lineage["name_taken"]["task"] == "classify"


@pytest.mark.django_db
def test_a_claim_refused_for_another_task_gives_its_number_back(teams):
    registered(teams["vision"], "pcb", "detect")
    with pytest.raises(NameOfAnotherTask), transaction.atomic():
        version_number_claim(team=teams["vision"], name="pcb", task="classify")
    with transaction.atomic():
        assert version_number_claim(team=teams["vision"], name="pcb", task="detect") == 2


def push(user, path, filename: str, **fields):
    upload = SimpleUploadedFile(filename, path.read_bytes(), content_type="application/octet-stream")
    return api_client(user).post("/api/v1/weights/", {"file": upload, **fields}, format="multipart")


@pytest.mark.django_db
def test_weights_of_another_task_uploaded_under_a_name_are_refused_on_the_file(bob, teams, yolov8n_pt, stores):
    registered(teams["vision"], "petnet", "classify")
    response = push(bob, yolov8n_pt, "petnet.pt")
    assert response.status_code == 400, response.content
    assert response.json()["file"][0].startswith(
        "petnet.pt holds a detect model, and petnet's versions are classify models (petnet:v1): a name's versions "
        "are one task, so that petnet:latest never switches task. Upload it under another name (e.g. "
        "petnet-detect.pt)")
    assert ModelVersion.objects.count() == 1
    assert not list(stores.MODELS_DIR.rglob("*.pt")), "nothing of the refused upload stays"


@pytest.mark.django_db
def test_a_name_given_apart_for_weights_of_another_task_is_refused_on_name(bob, teams, yolov8n_pt):
    registered(teams["vision"], "petnet", "classify")
    response = push(bob, yolov8n_pt, "yolov8n.pt", name="petnet.pt")
    assert response.status_code == 400 and list(response.json()) == ["name"], response.content


@pytest.mark.django_db
def test_weights_of_the_names_own_task_are_its_next_version(bob, teams, yolov8n_pt):
    registered(teams["vision"], "pcb", "detect")
    response = push(bob, yolov8n_pt, "pcb.pt")
    assert response.status_code == 201, response.content
    assert response.json()["version"] == 2


@pytest.mark.django_db
def test_the_weights_command_refuses_another_tasks_weights_under_a_name(teams, yolov8n_pt):
    registered(teams["vision"], "yolov8n", "classify")
    with pytest.raises(CommandError, match="holds a detect model, and yolov8n's versions are classify models"):
        call_command("weights", "add", str(yolov8n_pt), "--team", "vision", stdout=io.StringIO())


# --- Django admin: a version's identity is read-only once it exists ------------------------------


def admin_form(row: ModelVersion, **changes) -> dict:
    """The change form's fields as a browser posts them, every model field given (read-only ones are ignored)."""
    import json

    from django.forms.models import model_to_dict

    data = {}
    for key, value in {**model_to_dict(row), **changes}.items():
        data[key] = json.dumps(value) if isinstance(value, (dict, list)) else ("" if value is None else value)
    return data


def test_a_superuser_cannot_change_a_versions_task_or_name_nor_add_one_in_the_admin(superuser, teams):
    """The admin's change form let a superuser turn pcb:v1 from detect to classify (or move it to another
    name), so pcb's versions were two tasks, which version_number_claim keeps from ever happening."""
    from tests.conftest import admin_client

    version = ModelVersion.objects.create(team=teams["vision"], name="pcb", version=1, task="detect",
                                          weights_key="models/vision/pcb/v1/best.pt")
    ModelVersion.objects.create(team=teams["vision"], name="pets", version=1, task="classify",
                                weights_key="models/vision/pets/v1/best.pt")
    client = admin_client(superuser)
    url = f"/admin/registry/modelversion/{version.pk}/change/"
    response = client.post(url, admin_form(version, task="classify", name="pets", version=2,
                                           team=teams["robotics"].pk))
    assert response.status_code == 302, response.content.decode()[:2000]
    version.refresh_from_db()
    assert (version.team, version.name, version.version, version.task) == (teams["vision"], "pcb", 1, "detect")
    page = client.get(url).content.decode()
    assert 'name="task"' not in page and 'name="name"' not in page
    # Nor added here: an added row skipped the file's checks and the name's number and task.
    assert client.get("/admin/registry/modelversion/add/").status_code == 403


def test_a_superuser_cannot_change_a_versions_metrics_or_filename_in_the_admin(superuser, teams):
    """Both were still editable: a version's scores decide comparisons and rankings, and its filename
    is the uploaded file's. Read-only like the other fields fixed once a version exists."""
    from tests.conftest import admin_client

    version = ModelVersion.objects.create(team=teams["vision"], name="pcb", version=1, task="detect",
                                          weights_key="models/vision/pcb/v1/best.pt", filename="best.pt",
                                          metrics={"metrics/mAP50-95(B)": 0.41})
    client = admin_client(superuser)
    url = f"/admin/registry/modelversion/{version.pk}/change/"
    response = client.post(url, admin_form(version, metrics={"metrics/mAP50-95(B)": 0.99}, filename="renamed.pt"))
    assert response.status_code == 302, response.content.decode()[:2000]
    version.refresh_from_db()
    assert (version.metrics, version.filename) == ({"metrics/mAP50-95(B)": 0.41}, "best.pt")
    page = client.get(url).content.decode()
    assert 'name="metrics"' not in page and 'name="filename"' not in page
    assert "0.41" in page and "best.pt" in page  # still shown
