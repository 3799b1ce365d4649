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
