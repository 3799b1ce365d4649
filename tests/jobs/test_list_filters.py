"""jobs/ and queue/ filter by team, user and mine on the server (what `yoloq queue --team/--user`
asks); a name the caller may not read is a 400 naming the parameter (manager trial F23)."""

from __future__ import annotations

import pytest

from apps.jobs.models import JobState
from tests.conftest import api_client
from tests.jobs.factories import make_job

pytestmark = pytest.mark.django_db


@pytest.fixture
def jobs(teams, alice, bob, carol):
    return {
        "bob-queued": make_job(team=teams["vision"], user=bob, task_name="bob-queued", queue_position=2),
        "alice-queued": make_job(team=teams["vision"], user=alice, task_name="alice-queued", queue_position=1),
        "bob-running": make_job(team=teams["vision"], user=bob, task_name="bob-running", state=JobState.RUNNING),
        "carol-queued": make_job(team=teams["robotics"], user=carol, task_name="carol-queued", queue_position=3),
    }


def names(response) -> list[str]:
    assert response.status_code == 200, response.content
    return [j["task_name"] for j in response.json()["results"]]


def test_the_queue_filters_by_user_team_and_mine(jobs, alice):
    client = api_client(alice)
    assert names(client.get("/api/v1/queue/", {"user": "bob"})) == ["bob-queued"]
    assert names(client.get("/api/v1/queue/", {"mine": "true"})) == ["alice-queued"]
    assert names(client.get("/api/v1/queue/", {"team": "vision"})) == ["alice-queued", "bob-queued"]
    assert names(client.get("/api/v1/jobs/", {"user": "bob", "state": "running"})) == ["bob-running"]


@pytest.mark.parametrize("url", ["/api/v1/jobs/", "/api/v1/queue/"])
def test_a_user_outside_the_callers_teams_is_a_400_naming_the_parameter(url, jobs, alice):
    client = api_client(alice)
    for username in ("carol", "nobody"):  # another team's member and a name that does not exist: one answer
        response = client.get(url, {"user": username})
        assert response.status_code == 400
        assert response.json() == {"user": [f"no member of your teams is named '{username}'"]}
    response = client.get("/api/v1/queue/", {"team": "robotics"})
    assert response.status_code == 400 and "team" in response.json()
    response = client.get("/api/v1/queue/", {"mine": "maybe"})
    assert response.status_code == 400 and "mine" in response.json()


def test_jobs_take_the_portals_active_and_finished_state_groups(teams, alice, bob):
    """jobs/?state=active and ?state=finished filter as the portal's /jobs/ does (manager trial 15, F10)."""
    for state in JobState.values:
        make_job(team=teams["vision"], user=bob, task_name=f"bob-{state}", state=state)
    client = api_client(alice)
    active = ["bob-queued", "bob-starting", "bob-running"]
    assert sorted(names(client.get("/api/v1/jobs/", {"state": "active"}))) == sorted(active)
    finished = [f"bob-{state}" for state in ("succeeded", "failed", "cancelled", "timed_out")]
    assert sorted(names(client.get("/api/v1/jobs/", {"state": "finished"}))) == sorted(finished)
    response = client.get("/api/v1/jobs/", {"state": "ended"})
    assert response.status_code == 400
    assert "active, finished, queued" in response.json()["state"][0]
    schema = client.get("/api/v1/schema/", {"format": "json"}).json()
    parameters = schema["paths"]["/api/v1/jobs/"]["get"]["parameters"]
    assert {"active", "finished"} <= set(next(p for p in parameters if p["name"] == "state")["schema"]["enum"])


def test_someone_who_left_the_team_is_still_a_filter_for_their_jobs_there(jobs, alice, bob):
    """manage.py team remove-member leaves a member's running jobs to finish; the manager's (and the
    operator's) `?user=` then answered "no member of your teams is named 'bob'" (optrial24)."""
    from apps.accounts.models import Membership

    Membership.objects.filter(user=bob).delete()
    client = api_client(alice)
    assert names(client.get("/api/v1/jobs/", {"user": "bob", "state": "running"})) == ["bob-running"]
    assert names(client.get("/api/v1/queue/", {"user": "bob"})) == ["bob-queued"]
    for username in ("carol", "nobody"):  # still one answer for another team's member and a name that does not exist
        assert client.get("/api/v1/jobs/", {"user": username}).json() == {
            "user": [f"no member of your teams is named '{username}'"]}
