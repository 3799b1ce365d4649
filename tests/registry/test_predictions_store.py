"""A predict job's gallery with an object store (a real moto_server): the node uploaded its
predict/ folder there and the web, which never had the files, serves the results and the
annotated images from the store; while the store is down the API and the page say so (503)."""

from __future__ import annotations

import json

import pytest
from django.test import override_settings

from apps.core.storage import artifact_save_bytes
from apps.jobs.models import JobState
from apps.registry.models import ModelVersion, PredictionRun
from tests.conftest import api_client
from tests.jobs.factories import make_job
from tests.s3 import s3_storages, stop_moto

pytestmark = [pytest.mark.integration, pytest.mark.django_db]
JPEG = b"\xff\xd8\xff\xe0 an annotated image"


@pytest.fixture
def stored_run(bob, teams, moto, settings, tmp_path):
    settings.JOBS_DIR = tmp_path / "web" / "jobs"  # the web's disk: nothing of the job there
    job = make_job(team=teams["vision"], user=bob, state=JobState.SUCCEEDED)
    key = f"jobs/{job.pk}/predict"
    with override_settings(STORAGES=s3_storages(moto)):
        artifact_save_bytes(f"{key}/00000.jpg", JPEG)
        artifact_save_bytes(f"{key}/predictions.json", json.dumps(
            [{"image": "00000.jpg", "source": "a.jpg", "boxes": [{"class": 0, "name": "scratch", "conf": 0.9,
                                                                  "xyxy": [1, 2, 3, 4]}]}]).encode())
    version = ModelVersion.objects.create(team=teams["vision"], name="pcb", version=2, weights_key="x/best.pt", size=1)
    return PredictionRun.objects.create(job=job, key=key, images=1, boxes=1, version=version)


def test_the_gallery_is_served_from_the_store(bob, moto, stored_run):
    client = api_client(bob)
    with override_settings(STORAGES=s3_storages(moto)):
        body = client.get(f"/api/v1/jobs/{stored_run.job_id}/predictions/").json()
        assert [b["name"] for b in body["results"][0]["boxes"]] == ["scratch"]
        # The model by its reference, not its database id under "version" (trial 16, G3).
        assert body["model"] == {"id": stored_run.version.pk, "reference": "pcb:v2"} and "version" not in body
        image = client.get(body["results"][0]["url"])
        assert image.status_code == 200 and b"".join(image.streaming_content) == JPEG
        assert client.get(f"/api/v1/jobs/{stored_run.job_id}/predictions/1/image/").status_code == 404
        client.force_login(bob)
        page = client.get(f"/jobs/{stored_run.job_id}/predictions/")
        assert page.status_code == 200 and f"/api/v1/jobs/{stored_run.job_id}/predictions/0/image/" in page.text


def test_while_the_store_is_down_the_gallery_says_so(bob, moto, stored_run):
    client = api_client(bob)
    with override_settings(STORAGES=s3_storages(moto)):
        stop_moto(moto["process"])
        response = client.get(f"/api/v1/jobs/{stored_run.job_id}/predictions/")
        assert response.status_code == 503 and "artifact storage" in response.json()["detail"]
        client.force_login(bob)
        assert client.get(f"/jobs/{stored_run.job_id}/predictions/").status_code == 503
