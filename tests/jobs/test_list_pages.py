"""jobs/ next links carry on after the last job shown (?before=), so a script paging through its
jobs while others arrive, or while jobs leave a state filter, sees each job once (trial 32)."""

from __future__ import annotations

import uuid

import pytest

from apps.jobs.models import Job, JobState
from tests.conftest import api_client
from tests.jobs.factories import make_job

pytestmark = pytest.mark.django_db


def page(client, url: str, **params) -> dict:
    response = client.get(url, params)
    assert response.status_code == 200, response.content
    return response.json()


def test_jobs_that_arrive_between_two_pages_do_not_repeat_a_job_on_the_next(teams, bob):
    for n in range(5):
        make_job(team=teams["vision"], user=bob, task_name=f"old-{n}")
    client = api_client(bob)
    first = page(client, "/api/v1/jobs/", limit=2)
    for n in range(3):
        make_job(team=teams["vision"], user=bob, task_name=f"new-{n}")
    seen = [job["task_name"] for job in first["results"]]
    link = first["next"]
    while link:
        body = page(client, link)
        seen += [job["task_name"] for job in body["results"]]
        link = body["next"]
    assert seen == [f"old-{n}" for n in (4, 3, 2, 1, 0)]


def test_jobs_that_leave_a_state_filter_between_two_pages_do_not_hide_the_next_ones(teams, bob):
    queued = [make_job(team=teams["vision"], user=bob, task_name=f"q-{n}") for n in range(6)]
    client = api_client(bob)
    first = page(client, "/api/v1/jobs/", state="queued", limit=2)
    Job.objects.filter(pk__in=[job.pk for job in queued[4:]]).update(state=JobState.RUNNING)  # the two shown start
    second = page(client, first["next"])
    assert [job["task_name"] for job in second["results"]] == ["q-3", "q-2"]
    assert second["count"] == 4  # the list as it is now


def test_the_cursor_of_a_next_link_is_checked_and_named(teams, bob, carol):
    client = api_client(bob)
    other = make_job(team=teams["robotics"], user=carol)
    for value, problem in (
        (str(other.pk), "no job with that id in your teams"),
        (str(uuid.uuid4()), "no job with that id in your teams"),
        ("abc", "must be a job id (as a next link gives it), got 'abc'"),
    ):
        response = client.get("/api/v1/jobs/", {"before": value})
        assert response.status_code == 400
        assert response.json() == {"before": [problem]}
    mine = make_job(team=teams["vision"], user=bob)
    response = client.get("/api/v1/jobs/", {"before": str(mine.pk), "offset": "2"})
    assert response.status_code == 400
    assert list(response.json()) == ["offset"]


def test_the_schema_documents_the_cursor(bob):
    paths = api_client(bob).get("/api/v1/schema/", {"format": "json"}).json()["paths"]
    names = {p["name"] for p in paths["/api/v1/jobs/"]["get"]["parameters"]}
    assert {"before", "limit", "offset"} <= names
