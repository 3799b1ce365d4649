"""Trial 14, F32: a list filter names something the caller may read, or the answer is a 400 naming it.

`?team=nosuch` was an empty 200 (read as "no data"), and the usage report ignored `team`
altogether: a vision manager asking for robotics got vision's rows under a robotics URL.
"""

from __future__ import annotations

import pytest
from django.utils import timezone

from apps.quotas.models import UsageRecord
from tests.conftest import api_client, make_user
from tests.jobs.factories import make_job

pytestmark = pytest.mark.django_db

TEAM_LISTS = ["/api/v1/jobs/", "/api/v1/audit/", "/api/v1/usage/"]


def charge(job, hours: float) -> None:
    now = timezone.now()
    UsageRecord.objects.create(job=job, team=job.team, user=job.user, attempt=1, priority_class="medium",
                               gpu_seconds=hours * 3600, started_at=now - timezone.timedelta(hours=hours), ended_at=now)


@pytest.mark.parametrize("url", TEAM_LISTS)
def test_a_team_that_does_not_exist_and_another_orgs_team_get_the_same_400(url, alice, carol):
    client = api_client(alice)
    role = "a manager" if "audit" in url else "a member"
    for slug in ("nosuch", "robotics"):
        response = client.get(url, {"team": slug})
        assert response.status_code == 400, (url, slug, response.content)
        assert response.json() == {"team": [f"you are not {role} of a team named '{slug}'"]}


@pytest.mark.parametrize("url", TEAM_LISTS)
def test_the_callers_own_team_still_filters(url, alice):
    assert api_client(alice).get(url, {"team": "vision"}).status_code == 200


def test_the_usage_report_per_user_keeps_to_the_team_asked_for(teams, alice, bob, carol):
    """A manager of both teams asking for robotics sees robotics' users only, not vision's."""
    make_user("alice", teams["robotics"], "manager")
    charge(make_job(team=teams["vision"], user=bob), 2.0)
    charge(make_job(team=teams["robotics"], user=carol), 1.0)
    body = api_client(alice).get("/api/v1/usage/", {"group": "user", "team": "robotics"}).json()
    assert body["team"] == "robotics"
    assert [(row["key"], row["gpu_hours"]) for row in body["rows"]] == [("carol", 1.0)]
    body = api_client(alice).get("/api/v1/usage/", {"group": "team", "team": "vision"}).json()
    assert [(row["key"], row["gpu_hours"]) for row in body["rows"]] == [("vision", 2.0)]


@pytest.mark.parametrize("url, params, field", [
    ("/api/v1/jobs/", {"state": "sleeping"}, "state"),
    ("/api/v1/jobs/", {"mine": "maybe"}, "mine"),
    ("/api/v1/usage/", {"group": "node"}, "group"),
    ("/api/v1/audit/", {"action": "job.explode"}, "action"),
])
def test_an_unknown_value_of_an_enumerated_filter_is_a_400_naming_it(url, params, field, alice):
    response = api_client(alice).get(url, params)
    assert response.status_code == 400, response.content
    assert list(response.json()) == [field]
