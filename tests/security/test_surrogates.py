"""Lone UTF-16 surrogates (a JSON or YAML ``\\ud800`` escape): a 400 naming the field, nothing stored.

New-user trial 27, F1: a job spec's ``description: "\\ud800"`` was stored, its submit answered 500, and
from then on every ``GET jobs/`` of the team was a 500; a class name so in data.yaml did the same to
``GET datasets/``; a key so in any JSON body was echoed in "is not a known field", and that answer a 500.
"""

from __future__ import annotations

import json

import pytest

from apps.datasets.models import Dataset
from apps.jobs.models import Job
from tests.conftest import api_client
from tests.datasets.archives import make_zip, upload, valid_files
from tests.jobs.factories import make_job

pytestmark = pytest.mark.django_db

SPEC = {"task_name": "t", "command": "yolo train data=demo model=yolov8n.yaml epochs=1 imgsz=64"}


def json_body(document: dict) -> str:
    """``document`` as JSON text whose lone surrogates stay ``\\ud800`` escapes (what a client sends)."""
    return json.dumps(document, ensure_ascii=True)


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"description": "\ud800"}, "description"),
        ({"sweep": {"\udfffx": 1}}, "sweep.\\udfffx"),
        ({"resources": {"memory": "4Gi\ud800"}}, "resources.memory"),
    ],
    ids=["description", "sweep-key", "nested-value"],
)
def test_a_json_spec_with_a_lone_surrogate_is_a_400_naming_the_field(extra, field, bob, demo_registered):
    response = api_client(bob).post("/api/v1/jobs/", json_body(SPEC | extra), content_type="application/json")
    assert response.status_code == 400, response.content[:300]
    assert "surrogate" in response.json()[field][0]
    assert not Job.objects.exists()
    assert api_client(bob).get("/api/v1/jobs/").status_code == 200


def test_a_yaml_spec_with_a_lone_surrogate_is_a_400_naming_the_field(bob, demo_registered):
    body = f'task_name: t\ncommand: "{SPEC["command"]}"\ndescription: "\\ud800"\n'
    response = api_client(bob).post("/api/v1/jobs/", body, content_type="application/yaml")
    assert response.status_code == 400, response.content[:300]
    assert "surrogate" in response.json()["description"][0]
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("post", "/api/v1/tokens/"),
        ("post", "/api/v1/notifications/channels/"),
        ("patch", "/api/v1/notifications/preferences/"),
    ],
)
def test_a_json_key_with_a_lone_surrogate_is_a_400_not_a_500(method, path, bob):
    response = getattr(api_client(bob), method)(path, '{"\\ud800": 1}', content_type="application/json")
    assert response.status_code == 400, response.content[:300]
    assert "surrogate" in response.json()["\\ud800"][0]


def test_a_class_name_with_a_lone_surrogate_is_refused_and_nothing_stored(bob, settings, tmp_path):
    settings.DATASETS_DIR = tmp_path / "datasets"
    files = valid_files() | {"data.yaml": b'train: images/train\nval: images/val\nnames: [scratch, "\\ud800"]\n'}
    response = api_client(bob).post(
        "/api/v1/datasets/", {"file": upload(make_zip(files)), "name": "x"}, format="multipart"
    )
    assert response.status_code == 400, response.content[:300]
    (problem,) = response.json()["problems"]
    assert problem["path"] == "data.yaml" and problem["problem"].startswith("names[1]: ")
    assert "surrogate" in problem["problem"]
    assert not Dataset.objects.exists()
    assert api_client(bob).get("/api/v1/datasets/").status_code == 200


def test_a_job_stored_with_a_lone_surrogate_before_they_were_refused_is_still_listed(bob, teams):
    """Rows written before the parsers refused them: the answer escapes it (still JSON), not a 500.
    Only SQLite kept such rows: PostgreSQL's jsonb refuses a lone surrogate, as its text columns do."""
    from django.db import connection

    if connection.vendor == "postgresql":
        pytest.skip("PostgreSQL never stored a lone surrogate (jsonb refuses \\ud800): nothing to list")
    job = make_job(team=teams["vision"], user=bob)
    job.spec = {**job.spec, "description": "before \ud800"}
    job.save(update_fields=["spec"])
    response = api_client(bob).get("/api/v1/jobs/")
    assert response.status_code == 200
    assert b'"before \\ud800"' in response.content
    assert response.json()["results"][0]["id"] == str(job.pk)
