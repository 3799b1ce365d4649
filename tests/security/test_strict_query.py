"""Every list names a query parameter it does not take, or a value it cannot filter by, in a 400
(``models/?stage=bogus`` was an empty 200, read as "no such models"; trial 14, F32, as audit/)."""

from __future__ import annotations

import pytest

from apps.jobs.models import JobState
from apps.registry.models import ModelVersion
from tests.conftest import api_client
from tests.jobs.factories import make_job

pytestmark = pytest.mark.django_db

# audit/ had this first (tests/security/test_audit_and_usage_params.py); these are the rest.
PAGED = ["/api/v1/jobs/", "/api/v1/queue/", "/api/v1/datasets/", "/api/v1/models/", "/api/v1/tokens/",
         "/api/v1/teams/", "/api/v1/notifications/channels/", "/api/v1/notifications/deliveries/"]
UNPAGED = ["/api/v1/usage/", "/api/v1/cluster/",
           "/api/v1/jobs/{job}/metrics/", "/api/v1/jobs/{job}/logs/", "/api/v1/jobs/{job}/events/"]


@pytest.fixture
def job(alice, teams):
    return make_job(team=teams["vision"], user=alice, state=JobState.RUNNING)


@pytest.mark.parametrize("url", PAGED + UNPAGED)
def test_a_parameter_a_list_does_not_take_is_named(url, alice, job):
    response = api_client(alice).get(url.format(job=job.pk), {"stages": "production"})
    assert response.status_code == 400, response.content
    assert list(response.json()) == ["stages"]
    assert response.json()["stages"][0].startswith("is not a parameter of ")


@pytest.mark.parametrize("url", PAGED + UNPAGED)
def test_format_is_taken_everywhere_beside_an_unknown_parameter(url, alice, job):
    """DRF's ``?format=`` is every view's: only the unknown one is named."""
    response = api_client(alice).get(url.format(job=job.pk), {"format": "json", "stages": "production"})
    assert response.status_code == 400 and list(response.json()) == ["stages"]


@pytest.mark.parametrize("url", PAGED)
def test_a_paged_list_takes_limit_and_offset_and_says_how_it_is_paged_for_page(url, alice):
    client = api_client(alice)
    response = client.get(url, {"limit": 5, "offset": 0, "stages": "production"})
    assert response.status_code == 400 and list(response.json()) == ["stages"]
    response = client.get(url, {"page": 2, "stages": "production"})
    assert response.status_code == 400
    assert response.json()["page"] == ["is not a parameter of this list: it is paged with ?limit= (1 to 1000, "
                                       "default 100) and ?offset= (items to skip)"]
    assert response.json()["stages"][0].startswith("is not a parameter of ")


def test_the_team_list_comes_a_page_at_a_time(alice, carol, teams):
    """teams/ was a bare list that answered ?limit=0 with a 200 (manager trial 15, F26)."""
    from apps.accounts.models import Membership

    Membership.objects.create(user=alice, team=teams["robotics"], role="member")
    client = api_client(alice)
    page = client.get("/api/v1/teams/", {"limit": 1}).json()
    assert page["count"] == 2 and [t["team"] for t in page["results"]] == ["robotics"] and page["next"]
    assert [t["team"] for t in client.get("/api/v1/teams/", {"offset": 1}).json()["results"]] == ["vision"]
    response = client.get("/api/v1/teams/", {"limit": 0})
    assert response.status_code == 400 and response.json() == {"limit": ["must be a positive integer, got '0'"]}


def test_the_schema_gives_every_paged_list_limit_and_offset(alice):
    """The schema listed only action, after and team for audit/ (manager trial 15, F26)."""
    paths = api_client(alice).get("/api/v1/schema/", {"format": "json"}).json()["paths"]
    for url in [*PAGED, "/api/v1/audit/"]:
        names = {p["name"] for p in paths[url]["get"]["parameters"] if p["in"] == "query"}
        assert {"limit", "offset"} <= names, url


def test_every_get_in_the_schema_names_a_parameter_it_does_not_take(alice):
    """Detail endpoints (jobs/{id}/?foo=1) answered as if nothing were wrong while the lists named
    it: now every GET does, before it looks the object up (so an unknown id still shows it)."""
    import re
    import uuid

    client = api_client(alice)
    paths = client.get("/api/v1/schema/", {"format": "json"}).json()["paths"]
    ids = {"job_id": str(uuid.uuid4()), "index": "0"}
    urls = [re.sub(r"\{(\w+)\}", lambda m: ids.get(m.group(1), "999999"), path)
            for path, operations in paths.items() if "get" in operations and path != "/api/v1/schema/"]
    assert len(urls) >= 25
    for url in urls:
        response = client.get(url, {"foo": "1"})
        assert response.status_code == 400, (url, response.status_code)
        assert response.json()["foo"][0].startswith("is not a parameter of "), url


def test_a_job_names_an_unknown_parameter_and_still_takes_format(alice, job):
    client = api_client(alice)
    response = client.get(f"/api/v1/jobs/{job.pk}/", {"foo": "1"})
    assert response.status_code == 400
    assert response.json() == {"foo": ["is not a parameter of a job (it takes no parameters)"]}
    assert client.get(f"/api/v1/jobs/{job.pk}/", {"format": "json"}).status_code == 200


@pytest.mark.parametrize("url", PAGED + UNPAGED)
def test_a_parameter_given_twice_is_named_not_taken_at_its_last_value(url, alice, job):
    """jobs/?state=active&state=queued listed the queued jobs only, as if both had filtered (CI trial 17, H9)."""
    response = api_client(alice).get(url.format(job=job.pk) + "?format=json&format=json")
    assert response.status_code == 400, response.content
    assert response.json() == {"format": ["is given 2 times; give it once"]}


def test_jobs_state_given_twice_is_a_400_naming_it(alice, job):
    response = api_client(alice).get("/api/v1/jobs/?state=active&state=queued")
    assert response.status_code == 400 and response.json() == {"state": ["is given 2 times; give it once"]}


def test_the_model_list_names_a_stage_it_does_not_know(alice, teams):
    ModelVersion.objects.create(team=teams["vision"], name="pcb", version=1, stage="production")
    ModelVersion.objects.create(team=teams["vision"], name="pcb", version=2)
    client = api_client(alice)
    response = client.get("/api/v1/models/", {"stage": "bogus"})
    assert response.status_code == 400
    assert response.json() == {"stage": ["must be one of none, staging, production, archived, got 'bogus'"]}
    assert [v["version"] for v in client.get("/api/v1/models/", {"stage": "production"}).json()["results"]] == [1]


def test_the_model_list_comes_a_page_at_a_time_as_every_list(alice, teams):
    """It was a bare array (cut at 500) that refused ?limit= (CI trial 17, H3)."""
    for version in (1, 2, 3):
        ModelVersion.objects.create(team=teams["vision"], name="pcb", version=version)
    client = api_client(alice)

    page = client.get("/api/v1/models/", {"limit": 2, "offset": 1}).json()

    assert page["count"] == 3 and [v["version"] for v in page["results"]] == [2, 1]
    assert client.get("/api/v1/models/", {"stages": "x"}).json() == {
        "stages": ["is not a parameter of the model list (it takes team, name, stage, before, limit, offset)"]}


@pytest.mark.parametrize("url", ["/api/v1/models/", "/api/v1/datasets/"])
def test_models_and_datasets_name_a_team_the_caller_is_not_in(url, alice):
    response = api_client(alice).get(url, {"team": "robotics"})
    assert response.status_code == 400
    assert response.json() == {"team": ["you are not a member of a team named 'robotics'"]}
    assert api_client(alice).get(url, {"team": "vision"}).status_code == 200


def test_every_unknown_parameter_is_named_at_once(alice):
    response = api_client(alice).get("/api/v1/jobs/", {"status": "running", "sort": "created_at"})
    assert response.status_code == 400
    assert response.json() == {
        "sort": ["is not a parameter of the job list (it takes state, id, before, team, user, mine, limit, offset)"],
        "status": ["is not a parameter of the job list (it takes state, id, before, team, user, mine, limit, offset)"]}


@pytest.mark.parametrize("url", PAGED + UNPAGED + ["/api/v1/jobs/{job}/", "/api/v1/schema/"])
def test_an_unknown_format_is_a_400_naming_it_not_a_404(url, alice, job):
    """``?format=x`` was DRF's 404 "Not found.": the owner's own job read as missing, and no field was
    named (sec19, F4)."""
    import yaml

    response = api_client(alice).get(url.format(job=job.pk), {"format": "x"})
    assert response.status_code == 400, response.content
    body = yaml.safe_load(response.content)  # JSON, or the schema view's own default: YAML
    assert list(body) == ["format"] and "json" in str(body["format"])
