"""A failed, cancelled or timed-out training job's weights: its stored checkpoint is downloadable,
saying of which epoch; without one the 404 says why, never "yet" (new-user trial 16, G1)."""

from __future__ import annotations

import hashlib

import pytest

from apps.jobs.services import attempt_finish, attempt_start, job_cancel, job_claim
from tests.conftest import api_client

from .factories import make_job
from .factories import stored_checkpoint as checkpoint

pytestmark = pytest.mark.django_db


@pytest.fixture
def running(alice, teams, node, settings, tmp_path):
    settings.JOBS_DIR = tmp_path / "jobs"
    job = make_job(team=teams["vision"], user=alice, gpus=1, task_name="widgets")
    assert job_claim(job, node=node, gpu_indices=[0], gpu_share=1.0, run_class="medium")
    return attempt_start(job_id=job.pk, attempt_id=job.attempt_id, node_name="node-a")


@pytest.mark.parametrize("outcome", ["cancelled", "timed_out"])
def test_an_ended_jobs_best_checkpoint_is_its_weights(running, alice, settings, outcome):
    checkpoint(running, 9, best=True)
    best = checkpoint(running, 10, best=True)
    checkpoint(running, 11, best=False)
    assert attempt_finish(running, outcome=outcome, exit_code=-15) == outcome

    response = api_client(alice).get(f"/api/v1/jobs/{running.pk}/weights/")

    assert response.status_code == 200
    assert b"".join(response.streaming_content) == best
    assert response["X-Weights-Epoch"] == "10"
    assert "best.pt as of epoch 10" in response["X-Weights-Note"] and "after 11 epochs" in response["X-Weights-Note"]
    assert "epoch10.pt" in response["Content-Disposition"]


def test_the_weights_sha256_is_in_the_job_and_on_the_download(running, alice, settings):
    """A script could verify a job's weights only by way of its model version, and a checkpoint's
    not at all (CI trial 17, H4)."""
    best = checkpoint(running, 2, best=True)
    attempt_finish(running, outcome="timed_out", exit_code=-15)
    client = api_client(alice)

    response = client.get(f"/api/v1/jobs/{running.pk}/weights/")

    assert response["X-Weights-SHA256"] == hashlib.sha256(best).hexdigest()
    assert client.get(f"/api/v1/jobs/{running.pk}/").json()["weights"]["sha256"] == hashlib.sha256(best).hexdigest()


def test_without_a_best_checkpoint_the_newest_is_served(running, alice, settings):
    checkpoint(running, 3, best=False)
    last = checkpoint(running, 4, best=False)
    attempt_finish(running, outcome="cancelled", exit_code=-15)

    response = api_client(alice).get(f"/api/v1/jobs/{running.pk}/weights/")

    assert b"".join(response.streaming_content) == last and response["X-Weights-Epoch"] == "4"
    assert "last.pt" in response["X-Weights-Note"]


def test_a_job_cancelled_before_its_first_epoch_says_so(running, alice):
    attempt_finish(running, outcome="cancelled", exit_code=-15)

    response = api_client(alice).get(f"/api/v1/jobs/{running.pk}/weights/")

    assert response.status_code == 404
    assert response.json()["detail"] == "The job was cancelled before its first epoch ended, so it has no weights."


def test_a_job_cancelled_while_queued_says_it_never_started(alice, teams):
    """Trial 23: a job cancelled in the queue said "cancelled before its first epoch ended"."""
    job = make_job(team=teams["vision"], user=alice)
    assert job_cancel(job=job, by=alice)

    response = api_client(alice).get(f"/api/v1/jobs/{job.pk}/weights/")

    assert response.status_code == 404
    assert response.json()["detail"] == "The job was cancelled before it started, so it has no weights."


def test_only_an_active_job_has_no_weights_yet(running, alice):
    response = api_client(alice).get(f"/api/v1/jobs/{running.pk}/weights/")

    assert response.status_code == 404 and "yet: it is running" in response.json()["detail"]


def test_the_job_object_and_page_say_which_weights_there_are(running, alice, settings, client):
    checkpoint(running, 5, best=True)
    attempt_finish(running, outcome="timed_out", exit_code=-15)

    weights = api_client(alice).get(f"/api/v1/jobs/{running.pk}/").json()["weights"]
    client.force_login(alice)
    page = client.get(f"/jobs/{running.pk}/").content.decode()

    assert weights["available"] and weights["epoch"] == 5 and weights["url"] == f"jobs/{running.pk}/weights/"
    assert "timed out after 5 epochs" in weights["note"]
    assert f'id="weights-link" href="/api/v1/jobs/{running.pk}/weights/"' in page and "Weights (epoch 5)" in page
