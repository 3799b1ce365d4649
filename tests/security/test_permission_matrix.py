"""A permission matrix generated from the URL conf: every API endpoint and method, three personas.

Every ``/api/v1/`` route must be classified below; a new route that is not fails
``test_every_api_route_is_classified`` until someone decides who may use it.
"""

from __future__ import annotations

import re

import pytest
from django.urls import URLPattern, URLResolver, get_resolver

from apps.accounts.models import ApiToken
from apps.jobs.models import JobState
from tests.conftest import api_client
from tests.jobs.factories import make_job

pytestmark = pytest.mark.django_db

# URL name → "object" (addressed by id: outsiders get 404) or "collection" (lists: scoped;
# creates: only into the caller's teams) or "public" (no team data).
ROUTES = {
    "api-jobs": "collection",
    "api-job": "object",
    "api-job-cancel": "object",
    "api-job-requeue": "object",
    "api-job-metrics": "object",
    "api-job-logs": "object",
    "api-job-events": "object",
    "api-job-weights": "object",
    "api-queue": "collection",
    "api-cluster": "collection",
    "api-usage": "collection",
    "api-models": "collection",
    "api-model": "object",
    "api-model-download": "object",
    "api-datasets": "collection",
    "api-dataset": "object",
    "api-tokens": "collection",
    "api-token": "object",
    "api-audit": "collection",
    "api-schema": "public",
}
# (URL name, method) a team member may not use even on their own team's objects.
MANAGER_ONLY = {("api-job-requeue", "post")}
METHODS = ("get", "post", "put", "patch", "delete")


def api_routes() -> list[tuple[str, str, type]]:
    """(name, route template, view class) for every pattern under api/v1/."""
    found = []

    def walk(patterns, prefix):
        for pattern in patterns:
            route = prefix + str(pattern.pattern)
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, route)
            elif isinstance(pattern, URLPattern) and route.startswith("api/v1/"):
                found.append((pattern.name, route, pattern.callback.view_class))

    walk(get_resolver().url_patterns, "")
    return found


def methods_of(view_class) -> list[str]:
    return [m for m in METHODS if hasattr(view_class, m)]


def test_every_api_route_is_classified():
    assert {name for name, _, _ in api_routes()} == set(ROUTES)


@pytest.fixture
def world(alice, bob, carol, teams, settings, tmp_path):
    """Vision owns one of everything (with real files behind the downloads)."""
    from apps.datasets.models import Dataset
    from apps.registry.models import ModelVersion

    settings.JOBS_DIR = tmp_path / "jobs"
    job = make_job(team=teams["vision"], user=bob, state=JobState.RUNNING)
    weights = settings.JOBS_DIR / str(job.pk) / "best.pt"
    weights.parent.mkdir(parents=True)
    weights.write_bytes(b"weights")
    job.weights_path = str(weights)
    job.save(update_fields=["weights_path"])
    model = ModelVersion.objects.create(team=teams["vision"], name="pcb", version=1, job=job,
                                        weights_path=str(weights), size=7)
    dataset = Dataset.objects.create(team=teams["vision"], name="vision-secret", yaml_path="/nonexistent")
    token = ApiToken.objects.create(user=bob, name="bobs", key_hash="0" * 64, key_prefix="yp_bob")
    return {"job": job, "model": model, "dataset": dataset, "token": token}


def url_for(name: str, route: str, world) -> str:
    ids = {"api-model": world["model"].pk, "api-model-download": world["model"].pk,
           "api-dataset": world["dataset"].pk, "api-token": world["token"].pk}
    url = "/" + route
    url = re.sub(r"<uuid:\w+>", str(world["job"].pk), url)
    return re.sub(r"<int:\w+>", str(ids.get(name, 0)), url)


def matrix(kind: str):
    return [pytest.param(name, route, method, id=f"{method.upper()} {route}")
            for name, route, view in api_routes() if ROUTES.get(name) == kind for method in methods_of(view)]


@pytest.mark.parametrize(("name", "route", "method"), matrix("object"))
def test_an_outsider_gets_404_on_every_object_endpoint(name, route, method, world, carol):
    response = getattr(api_client(carol), method)(url_for(name, route, world))
    assert response.status_code == 404, (response.status_code, response.content[:200])
    assert str(world["job"].pk) not in response.content.decode()


@pytest.mark.parametrize(("name", "route", "method"), [p for p in matrix("object") if p.values[2] == "get"])
def test_the_owner_can_read_every_object_endpoint(name, route, method, world, bob):
    """The other side of the 404s above: they are about access, not about missing rows or files."""
    response = api_client(bob).get(url_for(name, route, world))
    assert response.status_code == 200, (response.status_code, response.content[:200])


@pytest.mark.parametrize(("name", "route", "method"), [p for p in matrix("collection") if p.values[2] == "get"])
def test_an_outsider_sees_nothing_of_another_team_in_lists(name, route, method, world, carol):
    response = api_client(carol).get(url_for(name, route, world))
    assert response.status_code == 200
    text = response.content.decode()
    for secret in (str(world["job"].pk), "vision", "bob", "pcb", "yp_bob"):
        assert secret not in text, f"{route} leaks {secret!r}"


@pytest.mark.parametrize(("name", "body"), [
    ("api-jobs", {"task_name": "x", "command": "yolo train data=demo model=yolov8n.yaml", "user": "vision"}),
    ("api-datasets", {"name": "x", "team": "vision"}),
])
def test_an_outsider_cannot_create_in_another_team(name, body, world, carol):
    from tests.datasets.archives import make_zip, upload, valid_files

    client = api_client(carol)
    if name == "api-datasets":
        response = client.post("/api/v1/datasets/", body | {"file": upload(make_zip(valid_files()))},
                               format="multipart")
        field = "team"
    else:
        response = client.post("/api/v1/jobs/", body, format="json")
        field = "user"
    assert response.status_code == 400 and "not a member" in str(response.json()[field])


@pytest.mark.parametrize(("name", "method"), sorted(MANAGER_ONLY))
def test_a_member_cannot_do_manager_things(name, method, world, bob, alice):
    route = next(r for n, r, _ in api_routes() if n == name)
    assert getattr(api_client(bob), method)(url_for(name, route, world)).status_code == 403
    assert getattr(api_client(alice), method)(url_for(name, route, world)).status_code in (200, 202)


def test_a_member_cannot_cancel_a_teammates_job(world, alice, teams):
    job = make_job(team=teams["vision"], user=alice)
    from tests.conftest import make_user

    other = make_user("erin", teams["vision"])
    assert api_client(other).post(f"/api/v1/jobs/{job.pk}/cancel/").status_code == 403


def test_a_member_reads_no_team_audit_entries(world, bob, alice):
    from apps.accounts.services import audit_record

    audit_record(actor=alice, action="job.cancel", team=world["job"].team)
    results = api_client(bob).get("/api/v1/audit/").json()["results"]
    assert all(e["team"] is None for e in results)


@pytest.mark.parametrize(("name", "route", "method"),
                         [p for kind in ("object", "collection") for p in matrix(kind)])
def test_anonymous_callers_are_refused_everywhere(name, route, method, world):
    from rest_framework.test import APIClient

    response = getattr(APIClient(), method)(url_for(name, route, world))
    assert response.status_code in (401, 403)


def test_file_downloads_outside_storage_are_refused(world, bob, tmp_path):
    """A weights path that points outside the jobs folder is never served, even to the owner."""
    outside = tmp_path / "secret.pt"
    outside.write_bytes(b"x")
    job = world["job"]
    job.weights_path = str(outside)
    job.save(update_fields=["weights_path"])
    assert api_client(bob).get(f"/api/v1/jobs/{job.pk}/weights/").status_code == 404


@pytest.mark.django_db(transaction=True)
def test_an_outsider_cannot_open_another_teams_job_socket(alice, bob, carol, teams):
    import asyncio

    from channels.testing import WebsocketCommunicator

    from yoloportal.asgi import application

    job = make_job(team=teams["vision"], user=bob)

    async def connect(user):
        communicator = WebsocketCommunicator(application, f"/ws/jobs/{job.pk}/",
                                             headers=[(b"origin", b"http://testserver"), (b"host", b"testserver")])
        communicator.scope["user"] = user
        connected, code = await communicator.connect(timeout=5)
        await communicator.disconnect()
        return connected, code

    connected, code = asyncio.run(connect(carol))
    assert not connected and code == 4404
    assert asyncio.run(connect(bob))[0], "the owner connects: the refusal is about access"
