"""A job's id in a path is read in any case: ``uuid.UUID`` does, and a client that upper-cases ids
(a spreadsheet, a Windows tool) got the generic 404 from Django's lower-case-only converter."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.conftest import api_client
from tests.jobs.factories import make_job

pytestmark = pytest.mark.django_db


@pytest.fixture
def bobs_job(bob, teams):
    return make_job(team=teams["vision"], user=bob)


def test_an_upper_case_job_id_finds_the_job(bob, bobs_job):
    response = api_client(bob).get(f"/api/v1/jobs/{str(bobs_job.pk).upper()}/")
    assert response.status_code == 200, response.content[:300]
    assert response.json()["id"] == str(bobs_job.pk)


def test_an_upper_case_id_under_a_job_finds_it_too(bob, bobs_job):
    assert api_client(bob).get(f"/api/v1/jobs/{str(bobs_job.pk).upper()}/events/").status_code == 200


def test_an_outsider_asking_in_upper_case_still_sees_no_job(carol, bobs_job):
    lower = api_client(carol).get(f"/api/v1/jobs/{bobs_job.pk}/")
    upper = api_client(carol).get(f"/api/v1/jobs/{str(bobs_job.pk).upper()}/")
    assert upper.status_code == lower.status_code == 404
    assert upper.json()["detail"] == lower.json()["detail"]


def test_the_portal_job_page_takes_an_upper_case_id(bob, bobs_job):
    client = Client()
    client.force_login(bob)
    assert client.get(f"/jobs/{str(bobs_job.pk).upper()}/").status_code == 200


def test_links_to_a_job_are_still_written_in_lower_case(bobs_job):
    from django.urls import reverse

    assert reverse("api-job", kwargs={"job_id": bobs_job.pk}) == f"/api/v1/jobs/{bobs_job.pk}/"
