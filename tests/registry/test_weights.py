"""Weights: uploaded (API, manage.py weights), checked before they are stored, resolved by name in specs."""

from __future__ import annotations

import io
import os
import pickle
import zipfile

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command

from apps.accounts.models import AuditEntry, StorageCharge
from apps.jobs.models import Job
from apps.registry.models import ModelVersion, SharedWeights
from tests.conftest import SEED_SPEC, api_client
from tests.registry.conftest import build_checkpoint

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def stores(settings, tmp_path):
    settings.MODELS_DIR = tmp_path / "models"
    settings.WEIGHTS_DIR = tmp_path / "weights"
    return settings


def push(user, path, name: str | None = None, **fields):
    upload = SimpleUploadedFile(name or path.name, path.read_bytes(), content_type="application/octet-stream")
    return api_client(user).post("/api/v1/weights/", {"file": upload, **fields}, format="multipart")


def evil_pt(tmp_path):
    class Boom:
        def __reduce__(self):
            return os.system, ("touch /tmp/owned-by-upload",)

    path = tmp_path / "yolov8s.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("yolov8s/data.pkl", pickle.dumps({"model": Boom()}, protocol=4))
    return path


def submit(user, command: str):
    spec = SEED_SPEC.replace('"yolo train data=demo model=yolov8n.yaml epochs=2 imgsz=128"', f'"{command}"')
    spec = spec.replace("user: vision", f"user: {user.memberships.first().team.slug}")
    return api_client(user).post("/api/v1/jobs/", spec, content_type="application/yaml")


def test_a_member_uploads_weights_that_become_a_version_and_resolve_by_file_name(bob, yolov8n_pt, demo_registered):
    response = push(bob, yolov8n_pt, "yolov8s.pt", team="vision")
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["name"], body["version"], body["source"], body["task"], body["filename"]) == (
        "yolov8s", 1, "upload", "detect", "yolov8s.pt")
    version = ModelVersion.objects.get()
    assert version.weights_key == "models/vision/yolov8s/v1/yolov8s.pt"
    assert StorageCharge.objects.get(key=version.weights_key).bytes == yolov8n_pt.stat().st_size
    assert AuditEntry.objects.filter(action="weights.upload", team__slug="vision").exists()

    job = submit(bob, "yolo train data=demo model=yolov8s.pt epochs=1")
    assert job.status_code == 201, job.content
    spec = Job.objects.get().spec
    assert spec["resolved"]["model"] == {"key": version.weights_key, "sha256": version.sha256}
    assert spec["inputs"]["model"] == version.as_parent()


def test_a_second_upload_of_a_name_is_the_next_version_and_specs_take_the_newest(bob, yolov8n_pt, demo_registered,
                                                                                 tmp_path):
    other = build_checkpoint("yolov8n.yaml", tmp_path, names={0: "widget"})
    push(bob, yolov8n_pt, "base.pt")
    assert push(bob, other, "base.pt").status_code == 201
    assert list(ModelVersion.objects.values_list("version", flat=True)) == [2, 1]
    submit(bob, "yolo train data=demo model=base.pt epochs=1")
    assert Job.objects.get().spec["inputs"]["model"]["version"] == 2


def test_weights_whose_class_names_hold_a_nul_are_stored_with_their_names_unknown(bob, tmp_path):
    """The scan's class names went into the version's lineage as the pickle had them: a NUL in one was a
    500 on PostgreSQL, which stores none in JSON text (trial28 F5). Such names are not plain: unknown."""
    odd = build_checkpoint("yolov8n.yaml", tmp_path, names={0: "wid\x00get", 1: "dent"})
    response = push(bob, odd, "odd.pt")
    assert response.status_code == 201, response.content
    assert ModelVersion.objects.get().class_names is None


def test_pushing_the_same_bytes_under_the_same_name_again_answers_the_version_it_made(bob, yolov8n_pt):
    first = push(bob, yolov8n_pt, "base.pt")
    again = push(bob, yolov8n_pt, "base.pt")
    assert again.status_code == 200, again.content
    assert again.json()["unchanged"] is True and again.json()["reference"] == first.json()["reference"] == "base:v1"
    assert list(ModelVersion.objects.values_list("version", flat=True)) == [1]
    assert list(StorageCharge.objects.values_list("bytes", flat=True)) == [yolov8n_pt.stat().st_size]


def test_a_name_given_apart_with_folders_in_it_is_refused_naming_name(bob, yolov8n_pt):
    upload = SimpleUploadedFile("mybase.pt", yolov8n_pt.read_bytes(), content_type="application/octet-stream")
    response = api_client(bob).post("/api/v1/weights/", {"file": upload, "name": "../../x.pt"}, format="multipart")
    assert response.status_code == 400, response.content
    assert "plain name" in response.json()["name"][0]
    assert not ModelVersion.objects.exists() and not StorageCharge.objects.exists()


def test_a_name_given_apart_is_the_file_name_specs_use(bob, yolov8n_pt):
    upload = SimpleUploadedFile("mybase.pt", yolov8n_pt.read_bytes(), content_type="application/octet-stream")
    response = api_client(bob).post("/api/v1/weights/", {"file": upload, "name": "x.pt"}, format="multipart")
    assert response.status_code == 201, response.content
    assert (response.json()["filename"], response.json()["reference"]) == ("x.pt", "x:v1")


def test_a_pickle_that_runs_code_is_refused_with_a_400_naming_the_global(bob, tmp_path):
    response = push(bob, evil_pt(tmp_path))
    assert response.status_code == 400
    body = response.json()
    assert "posix.system" in body["file"][0] and body["offending_global"] == "posix.system"
    assert not os.path.exists("/tmp/owned-by-upload")
    assert not ModelVersion.objects.exists() and not StorageCharge.objects.exists()


def test_nothing_of_a_refused_upload_stays_on_disk(bob, tmp_path, stores):
    push(bob, evil_pt(tmp_path))
    assert not [p for p in stores.MODELS_DIR.rglob("*") if p.is_file()]


@pytest.mark.parametrize("name", ["-x.pt", "weights.txt", ".hidden.pt", "a b.pt"])
def test_a_bad_file_name_is_refused(name, bob, yolov8n_pt):
    response = push(bob, yolov8n_pt, name)
    assert response.status_code == 400 and ".pt" in response.json()["file"][0]


def test_a_file_name_too_long_is_refused_saying_how_long_it_may_be(bob, yolov8n_pt):
    """A 150-character name got the rule for letters and folders, which it kept (new-user trial 27, F5)."""
    upload = SimpleUploadedFile("mybase.pt", yolov8n_pt.read_bytes(), content_type="application/octet-stream")
    response = api_client(bob).post("/api/v1/weights/", {"file": upload, "name": "w" * 150 + ".pt"}, format="multipart")
    assert response.status_code == 400, response.content
    assert response.json()["name"] == ["the file name has 150 characters before .pt; at most 100 are allowed"]
    assert not ModelVersion.objects.exists()


def test_weights_over_the_size_limit_are_refused(bob, yolov8n_pt, settings):
    settings.WEIGHTS_UPLOAD_MAX_BYTES = 1024
    response = push(bob, yolov8n_pt)
    assert response.status_code == 400 and "limit" in response.json()["file"][0]


def test_the_team_storage_quota_counts_weights(bob, yolov8n_pt, teams):
    teams["vision"].storage_quota_gb = 1.5 * yolov8n_pt.stat().st_size / 1024**3
    teams["vision"].save()
    assert push(bob, yolov8n_pt).status_code == 201
    response = push(bob, yolov8n_pt, "another.pt")
    assert response.status_code == 400 and "storage quota" in response.json()["file"][0]
    assert ModelVersion.objects.count() == 1


def test_an_upload_names_a_team_the_uploader_is_in(bob, carol, yolov8n_pt, teams):
    """Weights and datasets choose their team in one place (accounts.selectors.team_for_upload)."""
    response = push(bob, yolov8n_pt, team="robotics")
    assert response.status_code == 400
    assert response.json()["team"] == ["you are not a member of a team named 'robotics'"]
    from apps.accounts.models import Membership

    Membership.objects.create(user=bob, team=teams["robotics"])
    response = push(bob, yolov8n_pt)
    assert response.status_code == 400 and "is required" in response.json()["team"][0]
    assert push(bob, yolov8n_pt, team="robotics").status_code == 201
    assert ModelVersion.objects.get().team == teams["robotics"]


def test_another_teams_uploads_never_resolve(bob, carol, yolov8n_pt, demo_registered):
    assert push(carol, yolov8n_pt, "secret.pt").status_code == 201
    response = submit(bob, "yolo train data=demo model=secret.pt epochs=1")
    assert response.status_code == 400 and "neither your team's nor shared" in response.json()["command.model"][0]


def test_an_admin_adds_shared_weights_every_team_resolves_and_a_teams_own_win(bob, carol, yolov8n_pt,
                                                                           demo_registered, stores, tmp_path):
    call_command("weights", "add", str(yolov8n_pt), "--shared", "--name", "yolov8s.pt", stdout=io.StringIO())
    shared = SharedWeights.objects.get()
    assert (stores.WEIGHTS_DIR / "yolov8s.pt").is_file() and shared.task == "detect"
    response = submit(carol, "yolo train data=demo model=yolov8s.pt epochs=1")
    assert response.status_code == 201, response.content
    assert Job.objects.get().spec["inputs"]["model"] == {"kind": "shared", "name": "yolov8s.pt",
                                                          "sha256": shared.sha256}
    push(bob, yolov8n_pt, "yolov8s.pt")
    submit(bob, "yolo train data=demo model=yolov8s.pt epochs=1")
    assert Job.objects.get(user=bob).spec["inputs"]["model"]["kind"] == "version"


def test_the_weights_command_refuses_a_hostile_file_and_other_content_under_a_shared_name(yolov8n_pt, tmp_path):
    with pytest.raises(CommandError, match="posix.system"):
        call_command("weights", "add", str(evil_pt(tmp_path)), "--shared")
    call_command("weights", "add", str(yolov8n_pt), "--shared", "--name", "base.pt", stdout=io.StringIO())
    other = tmp_path / "other.pt"
    other.write_bytes(yolov8n_pt.read_bytes() + b"")
    from .conftest import build_checkpoint

    different = build_checkpoint("yolo11n.yaml", tmp_path)
    with pytest.raises(CommandError, match="--replace"):
        call_command("weights", "add", str(different), "--shared", "--name", "base.pt")
    call_command("weights", "add", str(different), "--shared", "--name", "base.pt", "--replace",
                 stdout=io.StringIO())
    out = io.StringIO()
    call_command("weights", "list", stdout=out)
    assert "base.pt" in out.getvalue()


def test_the_weights_command_says_what_it_did_to_shared_weights(yolov8n_pt, tmp_path):
    """A bad --name blamed the source file; --replace said "added" and audited only the new
    sha256; the same bytes again wrote another "added" entry (manager trial)."""
    from apps.accounts.models import AuditEntry

    from .conftest import build_checkpoint

    with pytest.raises(CommandError, match=r"--name '\.\./x\.pt': must be a plain file name"):
        call_command("weights", "add", str(yolov8n_pt), "--shared", "--name", "../x.pt")

    def add(path, *extra) -> str:
        out = io.StringIO()
        call_command("weights", "add", str(path), "--shared", "--name", "base.pt", *extra, stdout=out)
        return out.getvalue()

    assert "shared weights base.pt added" in add(yolov8n_pt)
    assert "already there with the same bytes: unchanged" in add(yolov8n_pt)
    first = SharedWeights.objects.get(filename="base.pt").sha256
    assert f"replaced (was sha256 {first[:12]}" in add(build_checkpoint("yolo11n.yaml", tmp_path), "--replace")
    entries = list(AuditEntry.objects.filter(action="weights.shared_add").order_by("pk"))
    assert [e.message for e in entries] == ["shared weights base.pt added", "shared weights base.pt replaced"]
    assert entries[1].data["replaced_sha256"] == first


def test_the_weights_command_stores_team_weights(yolov8n_pt, teams, alice):
    call_command("weights", "add", str(yolov8n_pt), "--team", "vision", "--user", "alice", stdout=io.StringIO())
    version = ModelVersion.objects.get()
    assert (version.team.slug, version.uploaded_by, version.source) == ("vision", alice, "upload")
    # The operator did it for alice: the audit log must not show alice uploading (manager trial F29).
    from apps.accounts.models import AuditEntry

    entry = AuditEntry.objects.get(action="weights.upload")
    assert (entry.actor, entry.actor_name) == (None, "operator (manage.py weights add)")
    call_command("weights", "add", str(yolov8n_pt), "--shared", "--name", "base.pt", stdout=io.StringIO())
    assert AuditEntry.objects.get(action="weights.shared_add").actor_name == "operator (manage.py weights add)"


def test_a_field_or_file_given_twice_is_refused_naming_it(bob, yolov8n_pt):
    """trial26: ``-F team=vision -F team=robotics`` (or two ``file`` parts) was taken as the last one,
    silently; query parameters given twice are a 400 everywhere, and so are these now."""
    def upload():
        return SimpleUploadedFile("mybase.pt", yolov8n_pt.read_bytes(), content_type="application/octet-stream")

    twice = api_client(bob).post("/api/v1/weights/", {"file": upload(), "team": ["vision", "robotics"]},
                                 format="multipart")
    assert twice.status_code == 400 and twice.json() == {"team": ["is given 2 times; give it once"]}, twice.content
    files = api_client(bob).post("/api/v1/weights/", {"file": [upload(), upload()]}, format="multipart")
    assert files.status_code == 400 and files.json() == {"file": ["is given 2 times; give it once"]}, files.content
    assert not ModelVersion.objects.exists() and not StorageCharge.objects.exists()
