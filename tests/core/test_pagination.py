"""Every paginated API list refuses a page it cannot give, naming the parameter (new-user trial:
``?page=999`` and ``?page_size=abc`` were silently ignored); portal lists never fail on ``?page=``."""

from __future__ import annotations

import pytest

from apps.jobs.models import JobState
from tests.conftest import api_client
from tests.jobs.factories import make_job

pytestmark = pytest.mark.django_db

LISTS = ["/api/v1/jobs/", "/api/v1/queue/", "/api/v1/datasets/", "/api/v1/tokens/", "/api/v1/audit/",
         "/api/v1/notifications/channels/", "/api/v1/notifications/deliveries/"]


@pytest.fixture
def two_jobs(alice, teams):
    return [make_job(team=teams["vision"], user=alice, state=JobState.QUEUED) for _ in range(2)]


@pytest.mark.parametrize("url", LISTS)
@pytest.mark.parametrize(("query", "field", "words"), [
    ("page=999", "page", "?limit="),
    ("page_size=abc", "page_size", "?offset="),
    ("limit=abc", "limit", "positive integer, got 'abc'"),
    ("limit=0", "limit", "positive integer, got '0'"),
    ("limit=-5", "limit", "positive integer, got '-5'"),
    ("limit=1001", "limit", "at most 1000"),
    ("offset=-1", "offset", "0 or a positive integer, got '-1'"),
    ("offset=x", "offset", "0 or a positive integer, got 'x'"),
])
def test_a_page_the_list_cannot_give_is_a_400_naming_the_parameter(url, query, field, words, alice):
    response = api_client(alice).get(f"{url}?{query}")
    assert response.status_code == 400, (url, response.content)
    assert list(response.json()) == [field]
    assert words in response.json()[field][0]


def test_an_offset_past_the_end_is_an_empty_page_with_the_count(alice, two_jobs):
    # A client paging through a list that shrank meanwhile (jobs started) ends there, no error.
    assert api_client(alice).get("/api/v1/jobs/?offset=3").json()["results"] == []
    assert api_client(alice).get("/api/v1/jobs/?offset=3").json()["count"] == 2


def test_pages_within_the_list_still_work(alice, two_jobs):
    client = api_client(alice)
    first = client.get("/api/v1/jobs/?limit=1").json()
    assert (first["count"], len(first["results"])) == (2, 1) and "before=" in first["next"]  # after the job shown (trial 32)
    assert len(client.get("/api/v1/jobs/?limit=1&offset=1").json()["results"]) == 1
    assert client.get("/api/v1/jobs/?offset=2").json()["results"] == []  # the end itself is an empty page
    assert len(client.get("/api/v1/jobs/?limit=&offset=").json()["results"]) == 2  # empty = the default


@pytest.mark.parametrize("page", ["999", "abc", "-1", "0"])
def test_the_portal_job_list_shows_a_page_for_any_page_number(page, client, alice, two_jobs):
    client.force_login(alice)
    response = client.get(f"/jobs/?page={page}")
    assert response.status_code == 200
    assert response.context["page"].number == 1
