"""A container job runs the team's own image, i.e. the team's own code: it must see no other
team's files. The weights store is mounted whole (shared weights, the AMP check's file), and
it holds each team's private folder ``weights/<team>/`` (issue 9, finding 1): those of other
teams are covered by an empty tmpfs (sec21, F4).

UNPROVEN against a real runtime here (no podman/docker works on these machines, see
worker/executors/container.py): the command line is what is checked.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from apps.jobs.models import Job
from tests.jobs.factories import make_job
from worker.executors.container import run_command
from worker.tasks import AttemptRunner

pytestmark = pytest.mark.django_db


@pytest.fixture
def weights_store(settings, tmp_path):
    settings.JOBS_DIR = tmp_path / "jobs"
    settings.WEIGHTS_DIR = tmp_path / "weights"
    for team in ("vision", "robotics"):
        (settings.WEIGHTS_DIR / team).mkdir(parents=True)
        (settings.WEIGHTS_DIR / team / "secret.pt").write_bytes(team.encode())
    (settings.WEIGHTS_DIR / "yolov8n.pt").write_bytes(b"shared")
    return settings.WEIGHTS_DIR


def container_command(job: Job) -> list[str]:
    spec = {**job.spec, "image": "attacker/image:1", "resolved": {"model": "yolov8n.yaml", "data_yaml": "/data/demo/data.yaml"}}
    Job.objects.filter(pk=job.pk).update(spec=spec)
    job = Job.objects.select_related("node", "team").get(pk=job.pk)
    runner = AttemptRunner(job)
    attempt = runner.attempt_spec(1, runner.child_config(1, None))
    return run_command("podman", attempt, base_dir=Path("/srv/yoloportal"))


def test_a_container_job_cannot_see_another_teams_weights_folder(teams, carol, node, weights_store):
    command = container_command(make_job(team=teams["robotics"], user=carol, node=node, gpu_indices=[0],
                                         state="running"))

    assert ["--tmpfs", f"{weights_store / 'vision'}:ro,size=4k"] in pairs(command)
    assert f"{weights_store}:{weights_store}:ro" in command  # the shared weights are still there
    assert not any(str(weights_store / "robotics") in part for part in command)  # its own folder is not hidden


def pairs(command: list[str]) -> list[list[str]]:
    return [command[i:i + 2] for i in range(len(command) - 1)]


@pytest.mark.parametrize("image", ["--privileged", "--volume=/data:/data:rw", "-v=/:/host", " ubuntu", "a b"])
def test_an_image_that_would_be_read_as_an_option_of_the_run_is_refused(image, bob, demo_registered):
    """``image`` is one argument of ``podman run`` before the image's command: "--privileged" was
    accepted, and a container job would have run privileged or with every team's data mounted
    (sec21, F8)."""
    from tests.conftest import api_client

    response = api_client(bob).post("/api/v1/jobs/", {
        "task_name": "x", "command": "yolo train data=demo model=yolov8n.yaml epochs=1", "image": image},
        format="json")

    assert response.status_code == 400 and "image" in response.json(), response.content
    assert not Job.objects.exists()


@pytest.mark.parametrize("image", ["ultralytics/ultralytics:8.3.0", "registry.example.org:5000/vision/yolo:1.0",
                                   "pytorch/pytorch@sha256:" + "a" * 64, "yoloportal"])
def test_image_references_are_still_accepted(image, bob, demo_registered):
    from tests.conftest import api_client

    response = api_client(bob).post("/api/v1/jobs/", {
        "task_name": "x", "command": "yolo train data=demo model=yolov8n.yaml epochs=1", "image": image},
        format="json")

    assert response.status_code == 201, response.content


def test_the_container_executor_refuses_an_option_as_the_image(tmp_path):
    from worker.executors.base import AttemptSpec

    spec = AttemptSpec(key="k", config_path=tmp_path / "c.json", events_path=tmp_path / "e", log_path=tmp_path / "l",
                       env={}, cwd=tmp_path, image="--privileged")
    with pytest.raises(ValueError, match="not a container image"):
        run_command("podman", spec, base_dir=Path("/srv/yoloportal"))
