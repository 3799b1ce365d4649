"""A training child's final report names the files it produced; the platform must take only
files inside that job's own folder (sec21, F1).

The child of a container job runs the team's own image (its own ``python``), and a Slurm
relay posts its ``final`` report over the API, so ``finished`` is the team's word. The host
then registered, copied and served whatever paths it named: a robotics job that reported
``weights: <vision's job>/best.pt`` became a robotics model version holding vision's weights,
downloadable by robotics. Checkpoints were already confined (``inside_run_dir``); weights,
exports and the predictions folder are now too.
"""

from __future__ import annotations

import json

import pytest

from apps.jobs.models import Job, JobState
from apps.jobs.services import attempt_finish
from apps.registry.models import Export, ModelVersion, PredictionRun
from tests.jobs.factories import make_job

pytestmark = pytest.mark.django_db


@pytest.fixture
def stores(settings, tmp_path):
    settings.JOBS_DIR = tmp_path / "jobs"
    settings.MODELS_DIR = tmp_path / "models"
    settings.WEIGHTS_DIR = tmp_path / "weights"
    settings.DATASETS_DIR = tmp_path / "datasets"
    return settings


@pytest.fixture
def vision_files(stores, teams, bob):
    """Vision's finished job (its weights, its predictions) and one image of its dataset."""
    job = make_job(team=teams["vision"], user=bob, state=JobState.SUCCEEDED)
    weights = job.run_dir / "train" / "weights" / "best.pt"
    weights.parent.mkdir(parents=True)
    weights.write_bytes(b"vision's secret weights")
    predict = job.run_dir / "predict"
    predict.mkdir()
    (predict / "00000.jpg").write_bytes(b"\xff\xd8vision")
    (predict / "predictions.json").write_text(json.dumps([{"image": "00000.jpg", "source": "x.jpg", "boxes": []}]))
    image = stores.DATASETS_DIR / "vision" / "secret" / "v1" / "images" / "train" / "0.jpg"
    image.parent.mkdir(parents=True)
    image.write_bytes(b"\xff\xd8vision image")
    return {"weights": weights, "predict": predict, "image": image}


def robotics_job(teams, carol, mode: str = "train") -> Job:
    job = make_job(team=teams["robotics"], user=carol, state=JobState.RUNNING)
    Job.objects.filter(pk=job.pk).update(spec={**job.spec, "mode": mode})
    job.refresh_from_db()
    job.run_dir.mkdir(parents=True, exist_ok=True)
    return job


def downloads(client, job) -> bytes:
    answer = client.get(f"/api/v1/jobs/{job.pk}/weights/")
    return b"".join(answer.streaming_content) if answer.status_code == 200 else b""


def test_weights_reported_outside_the_jobs_folder_are_not_registered_or_served(teams, carol, vision_files):
    from tests.conftest import api_client

    job = robotics_job(teams, carol)

    attempt_finish(job, outcome="succeeded", exit_code=0,
                   finished={"mode": "train", "weights": str(vision_files["weights"]), "metrics": {}, "exports": []})

    job.refresh_from_db()
    assert job.state == JobState.FAILED and "outside" in job.error
    assert not job.weights_path
    assert not ModelVersion.objects.filter(team=teams["robotics"]).exists()
    assert b"vision" not in downloads(api_client(carol), job)


def test_an_export_reported_outside_the_jobs_folder_is_not_recorded(teams, carol, vision_files):
    job = robotics_job(teams, carol, mode="export")
    own = job.run_dir / "model.onnx"
    own.write_bytes(b"onnx")

    attempt_finish(job, outcome="succeeded", exit_code=0, finished={
        "mode": "export", "exports": [{"format": "onnx", "path": str(own)},
                                      {"format": "onnx", "path": str(vision_files["image"])}]})

    job.refresh_from_db()
    assert job.state == JobState.FAILED and "exports[1]" in job.error
    assert not Export.objects.filter(job=job).exists()


def test_a_predictions_folder_outside_the_jobs_folder_is_not_recorded(teams, carol, vision_files):
    from tests.conftest import api_client

    job = robotics_job(teams, carol, mode="predict")

    attempt_finish(job, outcome="succeeded", exit_code=0,
                   finished={"mode": "predict", "folder": str(vision_files["predict"]), "images": 1, "boxes": 0})

    job.refresh_from_db()
    assert job.state == JobState.FAILED and "folder" in job.error
    assert not PredictionRun.objects.filter(job=job).exists()
    assert api_client(carol).get(f"/api/v1/jobs/{job.pk}/predictions/0/image/").status_code == 404


def test_a_symlink_in_the_jobs_folder_to_another_teams_weights_is_refused_too(teams, carol, vision_files):
    job = robotics_job(teams, carol)
    link = job.run_dir / "train" / "weights" / "best.pt"
    link.parent.mkdir(parents=True)
    link.symlink_to(vision_files["weights"])

    attempt_finish(job, outcome="succeeded", exit_code=0,
                   finished={"mode": "train", "weights": str(link), "metrics": {}, "exports": []})

    job.refresh_from_db()
    assert job.state == JobState.FAILED
    assert not ModelVersion.objects.filter(team=teams["robotics"]).exists()


def test_outputs_inside_the_jobs_folder_are_still_recorded(teams, carol, stores):
    job = robotics_job(teams, carol)
    weights = job.run_dir / "train" / "weights" / "best.pt"
    weights.parent.mkdir(parents=True)
    weights.write_bytes(b"robotics weights")

    assert attempt_finish(job, outcome="succeeded", exit_code=0,
                          finished={"mode": "train", "weights": str(weights), "metrics": {}, "exports": []}) == "succeeded"

    assert ModelVersion.objects.filter(team=teams["robotics"], job=job).exists()
