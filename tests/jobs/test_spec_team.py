"""The team a submit is charged to (apps.jobs.services.spec_team) against the ways a spec reaches a submit (review29)."""

from __future__ import annotations

import re

from django.test import Client

from apps.accounts.services import membership_set
from apps.jobs.models import Job
from tests.conftest import SEED_SPEC, api_client, make_user


def test_a_user_named_like_one_of_their_teams_who_names_that_team_is_charged_to_it(teams, demo_registered):
    """`team: vision` from a user whose username is also `vision` names the team: it was taken as "my own
    name" and, with two teams, refused as naming none (before efe690a it went to robotics, the first)."""
    vision = make_user("vision", teams["vision"])
    membership_set(user=vision, team=teams["robotics"], role="member")
    response = api_client(vision).post("/api/v1/jobs/", SEED_SPEC.replace("user: vision", "team: vision"),
                                       content_type="application/yaml")
    assert response.status_code == 201, response.content
    assert response.json()["team"] == "vision"


def test_the_submit_pages_own_example_is_accepted_from_a_member_of_two_teams(teams, demo_registered):
    """The YAML box's prefilled example names no team: submitted as shown, it is refused for every
    member of several teams ("team/user: is required ...")."""
    dana = make_user("dana", teams["vision"])
    membership_set(user=dana, team=teams["robotics"], role="member")
    client = Client()
    client.force_login(dana)
    page = client.get("/jobs/new/").content.decode()
    import html

    example = html.unescape(re.search(r'(?s)<textarea name="y-spec_text"[^>]*>(.*?)</textarea>', page).group(1))
    response = client.post("/jobs/new/", {"mode": "yaml", "y-spec_text": example.strip() + "\n"})
    assert response.status_code == 302, re.findall(r"is required[^<]*", response.content.decode())
    assert Job.objects.count() == 1


def test_a_null_body_is_named_like_the_other_non_object_bodies(bob):
    """6a798f2 names 'body' for a list, a string, a number; its `null` entry is never reached (DRF refuses
    None before to_internal_value, with its field-less non_field_errors)."""
    response = api_client(bob).post("/api/v1/tokens/", "null", content_type="application/json")
    assert response.status_code == 400 and "body" in response.json(), response.content
