"""Findings 1 and 6 from the other side: what stays allowed next to what the hostile corpus refuses."""

from __future__ import annotations

import pytest

from tests.conftest import SEED_SPEC, api_client

pytestmark = pytest.mark.django_db


@pytest.fixture
def weights_store(settings, tmp_path):
    settings.WEIGHTS_DIR = tmp_path / "weights"
    for team in ("vision", "robotics"):
        (settings.WEIGHTS_DIR / team / "sub").mkdir(parents=True)
        (settings.WEIGHTS_DIR / team / "sub" / "mine.pt").write_bytes(team.encode())
        (settings.WEIGHTS_DIR / team / "mine.pt").write_bytes(team.encode())
    (settings.WEIGHTS_DIR / "yolov8n.pt").write_bytes(b"shared")
    return settings.WEIGHTS_DIR


def submit(user, command: str, resources: str = '{gpu: 1, memory: 4Gi, cpu: "1"}'):
    body = SEED_SPEC.replace('"yolo train data=demo model=yolov8n.yaml epochs=2 imgsz=128"', f'"{command}"')
    body = body.replace('{gpu: 1, memory: 4Gi, cpu: "1"}', resources)
    return api_client(user).post("/api/v1/jobs/", body, content_type="application/yaml")


@pytest.mark.parametrize(("model", "expected"), [
    ("yolov8n.pt", "yolov8n.pt"),            # a bare name: the shared store
    ("mine.pt", "vision/mine.pt"),           # the team's own folder wins over the shared store
    ("sub/mine.pt", "vision/sub/mine.pt"),   # a path inside the team's own folder
])
def test_shared_and_own_weights_still_resolve(model, expected, bob, demo_registered, weights_store):
    from apps.jobs.models import Job

    response = submit(bob, f"yolo train data=demo model={model} epochs=2")
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    assert job.spec["resolved"]["model"]["key"] == f"weights/{expected}"
    assert job.spec["inputs"]["model"]["kind"] == ("shared" if expected == model else "team-file")


def test_a_symlink_out_of_the_teams_folder_is_refused(bob, demo_registered, weights_store):
    (weights_store / "vision" / "link.pt").symlink_to(weights_store / "robotics" / "mine.pt")
    response = submit(bob, "yolo train data=demo model=link.pt")
    assert response.status_code == 400 and "command.model" in response.json()


def test_a_symlink_in_the_shared_store_into_a_team_folder_is_refused(bob, demo_registered, weights_store):
    (weights_store / "leak.pt").symlink_to(weights_store / "robotics" / "mine.pt")
    response = submit(bob, "yolo train data=demo model=leak.pt")
    assert response.status_code == 400 and "command.model" in response.json()


@pytest.mark.parametrize(("command", "resources"), [
    ("yolo train data=demo model=yolov8n.yaml epochs=100 save_period=5", None),    # 20 files: the limit
    ("yolo train data=demo model=yolov8n.yaml epochs=10000 save_period=-1", None),
    ("yolo train data=demo model=yolov8n.yaml workers=1", None),
    ("yolo train data=demo model=yolov8n.yaml workers=8", '{gpu: 1, cpu: "8"}'),
    ("yolo train data=demo model=yolov8n.yaml workers=8", "{gpu: 1}"),
    ("yolo train data=demo model=yolov8n.yaml cache=false", None),
    ("yolo train data=demo model=yolov8n.yaml batch=-1", "{gpu: 1}"),
    ("yolo train data=demo model=yolov8n.yaml batch=0.7", "{gpu: 2}"),
    ("yolo train data=demo model=yolov8n.yaml batch=8", "{gpu: 0.5}"),
    # A share's GPU memory is enforced in the child and auto-batch sizes against the share (issue 12).
    ("yolo train data=demo model=yolov8n.yaml batch=-1", "{gpu: 0.5}"),
    ("yolo train data=demo model=yolov8n.yaml batch=0.7", "{gpu: 0.25}"),
])
def test_arguments_within_the_limits_pass(command, resources, bob, demo_registered):
    response = submit(bob, command, resources) if resources else submit(bob, command)
    assert response.status_code == 201, response.content


def test_the_limits_follow_their_settings(bob, demo_registered, settings):
    settings.TRAIN_MAX_WORKERS = 2
    settings.TRAIN_MAX_SAVED_EPOCHS = 3
    response = submit(bob, "yolo train data=demo model=yolov8n.yaml workers=3 epochs=10 save_period=2", "{gpu: 1}")
    errors = response.json()
    assert response.status_code == 400
    assert "the limit is 2" in errors["command.workers"][0]
    assert "the limit is 3" in errors["command.save_period"][0]


def test_workers_has_one_limit_the_setting_named_in_the_refusal(bob, demo_registered, settings):
    """The parser allowed 0–64 and TRAIN_MAX_WORKERS said 8: 65 was refused by the parser's "between
    0 and 64", not by the limit, and raising the setting past 64 changed nothing."""
    command = "yolo train data=demo model=yolov8n.yaml workers=65"
    refused = submit(bob, command, "{gpu: 1}")
    assert refused.status_code == 400
    assert refused.json()["command.workers"] == [
        "is 65; the limit is 8 dataloader workers per job (TRAIN_MAX_WORKERS)"]
    settings.TRAIN_MAX_WORKERS = 100
    assert submit(bob, command, "{gpu: 1}").status_code == 201
