"""Deleting a team that still owns datasets or registered models is refused, naming them: the
cascade took the rows and left their folders and weights files in storage, reachable by nobody
and cleaned by nothing (left31). Deleting each through its own service (audited, files removed,
refused while a job uses it) comes first; then the team goes."""

from __future__ import annotations

import threading

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db.models import ProtectedError

from apps.accounts.models import StorageCharge, Team
from apps.datasets.models import Dataset
from apps.datasets.services import dataset_delete
from apps.registry.models import ModelVersion
from apps.registry.services import model_version_delete
from tests.conftest import admin_client, api_client
from tests.datasets.archives import make_zip, upload, valid_files
from tests.registry.conftest import yolov8n_pt  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def stores(settings, tmp_path):
    settings.DATASETS_DIR = tmp_path / "datasets"
    settings.MODELS_DIR = tmp_path / "models"
    settings.WEIGHTS_DIR = tmp_path / "weights"
    return tmp_path


@pytest.fixture
def owned(bob, yolov8n_pt, stores):  # noqa: F811
    """vision with one dataset version and one uploaded weights version, no jobs; their files."""
    dataset = api_client(bob).post(
        "/api/v1/datasets/", {"file": upload(make_zip(valid_files())), "name": "pcb"}, format="multipart"
    )
    assert dataset.status_code == 201, dataset.content
    weights = SimpleUploadedFile("det.pt", yolov8n_pt.read_bytes(), content_type="application/octet-stream")
    version = api_client(bob).post("/api/v1/weights/", {"file": weights, "team": "vision"}, format="multipart")
    assert version.status_code == 201, version.content
    files = [stores / "datasets" / "vision" / "pcb" / "v1", stores / "models" / "vision" / "det" / "v1" / "det.pt"]
    assert all(path.exists() for path in files)
    return files


REFUSAL = (
    "vision still owns 1 dataset version (vision/pcb:v1) and 1 model version (vision/det:v1): "
    "delete them first (their files go with them)"
)


def test_a_team_owning_datasets_and_models_is_not_deleted_from_its_admin_page(superuser, teams, owned):
    url = f"/admin/accounts/team/{teams['vision'].pk}/delete/"

    response = admin_client(superuser).post(url, {"post": "yes"}, follow=True)

    assert Team.objects.filter(slug="vision").exists()
    assert [str(m) for m in response.context["messages"]] == [f"not deleted: {REFUSAL}"]
    assert all(path.exists() for path in owned)
    assert Dataset.objects.count() == ModelVersion.objects.count() == 1 and StorageCharge.objects.count() == 2


def test_a_team_owning_data_is_not_deleted_by_delete_selected_either(superuser, teams, owned):
    data = {"action": "delete_selected", "_selected_action": [teams["vision"].pk]}
    client = admin_client(superuser)

    asked = client.post("/admin/accounts/team/", data)
    client.post("/admin/accounts/team/", data | {"post": "yes"})

    assert REFUSAL in asked.content.decode()
    assert Team.objects.filter(slug="vision").exists() and all(path.exists() for path in owned)


def test_no_other_path_deletes_the_rows_under_their_files(teams, owned):
    with pytest.raises(ProtectedError):
        teams["vision"].delete()
    with pytest.raises(ProtectedError):
        Team.objects.filter(slug="vision").delete()
    assert all(path.exists() for path in owned)


def test_once_its_data_is_deleted_through_the_services_the_team_goes(superuser, alice, teams, owned):
    dataset_delete(dataset=Dataset.objects.get(), by=alice)
    model_version_delete(version=ModelVersion.objects.get(), by=alice)

    response = admin_client(superuser).post(f"/admin/accounts/team/{teams['vision'].pk}/delete/", {"post": "yes"})

    assert response.status_code == 302 and not Team.objects.filter(slug="vision").exists()
    assert not any(path.exists() for path in owned) and not StorageCharge.objects.exists()


def test_the_refusal_names_the_first_three_of_many_and_counts_them_all(teams):
    from apps.accounts.services import team_delete_refusal

    for version in range(1, 6):
        Dataset.objects.create(
            team=teams["vision"], name="scans", version=version, key=f"datasets/vision/scans/v{version}"
        )

    assert team_delete_refusal(teams["vision"]) == (
        "vision still owns 5 dataset versions (vision/scans:v1, vision/scans:v2, vision/scans:v3 …): "
        "delete them first (their files go with them)"
    )
    assert team_delete_refusal(teams["robotics"]) is None


@pytest.mark.django_db(transaction=True)
def test_delete_selected_of_a_team_without_data_deletes_it_and_audits_it_without_the_deleted_team(superuser, teams):
    """The bulk delete's audit entry named the team it had just deleted as its team: a foreign key
    to no row, refused at commit (IntegrityError: a 500 after the team was gone). As the delete page
    does, the entry of a deleted team belongs to no team; its id is the target's."""
    from apps.accounts.models import AuditEntry

    robotics = teams["robotics"].pk
    data = {"action": "delete_selected", "_selected_action": [robotics], "post": "yes"}

    response = admin_client(superuser).post("/admin/accounts/team/", data)

    assert response.status_code == 302 and not Team.objects.filter(pk=robotics).exists()
    entry = AuditEntry.objects.get(action=AuditEntry.Action.ADMIN_DELETE, target_id=str(robotics))
    assert entry.team_id is None and "robotics" in entry.message


def register_a_dataset_at_the_admin_log(team):
    """A dataset of ``team`` registered, by another connection (an upload's request), at the admin's
    log of the deletion: Django writes it after every check (the refusal, its protected list) and just
    before the delete. PostgreSQL only: on SQLite the delete's IMMEDIATE transaction holds the write
    lock from before the checks, so no registration can land between them and the delete."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("SQLite serialises the checks and the delete (IMMEDIATE): nothing lands in between")
    done = []

    def register() -> None:
        try:
            Dataset.objects.create(team=team, name="late", version=1, key="datasets/vision/late/v1")
        finally:
            connection.close()

    def hook(execute, sql, params, many, context):
        if not done and sql.startswith('INSERT INTO "django_admin_log"'):
            done.append(threading.Thread(target=register))
            done[0].start()
            done[0].join(10)
        return execute(sql, params, many, context)

    return connection.execute_wrapper(hook)


@pytest.mark.django_db(transaction=True)
def test_a_dataset_registered_after_the_checks_is_said_not_a_500(superuser, teams):
    """The refusal passed, then a dataset was registered to the team before its delete: Django's
    PROTECT raised ProtectedError, a 500 (review32). Said as the refusal says it; nothing deleted."""
    client = admin_client(superuser)
    client.raise_request_exception = False

    with register_a_dataset_at_the_admin_log(teams["vision"]):
        response = client.post(f"/admin/accounts/team/{teams['vision'].pk}/delete/", {"post": "yes"}, follow=True)

    assert response.status_code == 200
    assert [str(m) for m in response.context["messages"]] == [
        "not deleted: vision still owns 1 dataset version (vision/late:v1): delete them first (their files go with them)"
    ]
    assert Team.objects.filter(slug="vision").exists()


@pytest.mark.django_db(transaction=True)
def test_a_dataset_registered_after_delete_selected_asked_is_said_not_a_500(superuser, teams):
    from django.contrib.admin.models import LogEntry

    client = admin_client(superuser)
    client.raise_request_exception = False
    data = {"action": "delete_selected", "_selected_action": [teams["vision"].pk], "post": "yes"}

    with register_a_dataset_at_the_admin_log(teams["vision"]):
        response = client.post("/admin/accounts/team/", data, follow=True)

    assert response.status_code == 200
    said = [str(m) for m in response.context["messages"]]
    assert said == ["not deleted: still used by dataset vision/late:v1 (added meanwhile): delete those first"], said
    assert Team.objects.filter(slug="vision").exists() and not LogEntry.objects.exists()
