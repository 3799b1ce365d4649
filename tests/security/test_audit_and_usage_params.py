"""The audit list names a parameter it does not take or cannot read (?after=abc was page one); the
usage pages keep to the team asked for, and another team's is a 404 saying so (trial 14, F32)."""

from __future__ import annotations

import pytest
from django.utils import timezone

from apps.accounts.services import audit_record
from apps.quotas.models import UsageRecord
from tests.conftest import admin_client, api_client, make_user
from tests.jobs.factories import make_job

pytestmark = pytest.mark.django_db


def test_audit_after_takes_an_entry_id_and_names_a_bad_one(alice, teams):
    first = audit_record(actor=alice, action="job.cancel", team=teams["vision"], message="first")
    audit_record(actor=alice, action="job.cancel", team=teams["vision"], message="second")
    client = api_client(alice)
    response = client.get("/api/v1/audit/", {"after": "abc"})
    assert response.status_code == 400
    assert response.json() == {"after": ["must be an audit entry id (a whole number), got 'abc'"]}
    newer = client.get("/api/v1/audit/", {"after": str(first.pk), "action": "job.cancel"}).json()["results"]
    assert [e["message"] for e in newer] == ["second"]


def test_audit_after_pages_oldest_first_so_a_poller_misses_nothing(alice, teams):
    """Newest first, a poller reading one page after its last id skipped what lay between (manager trial 15, F5)."""
    first = audit_record(actor=alice, action="job.cancel", team=teams["vision"], message="0")
    for n in range(1, 6):
        audit_record(actor=alice, action="job.cancel", team=teams["vision"], message=str(n))
    client = api_client(alice)
    seen, last = [], first.pk
    while page := client.get("/api/v1/audit/", {"after": str(last), "limit": "2", "action": "job.cancel"}).json()[
            "results"]:
        seen += [e["message"] for e in page]
        last = page[-1]["id"]
    assert seen == ["1", "2", "3", "4", "5"]


def test_audit_names_a_parameter_it_does_not_take(alice):
    response = api_client(alice).get("/api/v1/audit/", {"since": "2026-01-01"})
    assert response.status_code == 400
    assert response.json()["since"][0].startswith("is not a parameter of the audit list (it takes team, action, after")


def charge(team, user, hours: float) -> None:
    now = timezone.now()
    job = make_job(team=team, user=user, state="succeeded", finished_at=now)
    UsageRecord.objects.create(job=job, team=team, user=user, attempt=1, priority_class="medium",
                               gpu_seconds=hours * 3600, started_at=now - timezone.timedelta(hours=hours),
                               ended_at=now)


@pytest.fixture
def two_team_manager(teams, manager, carol):
    """alice manages vision and is a member of robotics: both teams have usage."""
    from apps.accounts.services import membership_set

    membership_set(user=manager, team=teams["robotics"], role="member")
    charge(teams["vision"], manager, 2.0)
    charge(teams["robotics"], carol, 3.0)
    return manager


@pytest.mark.parametrize("url", ["/usage/", "/admin/quotas/usagereport/"])
def test_the_usage_pages_keep_to_the_team_asked_for(url, two_team_manager, teams, superuser):
    client = admin_client(two_team_manager if url == "/usage/" else superuser)
    def report(params) -> str:
        html = client.get(url, params).content.decode()
        return html[html.index('id="usage-report"'):]

    html = report({"team": "vision", "group": "team"})
    assert "<td>vision</td>" in html and "<td>robotics</td>" not in html
    html = report({"group": "team"})
    assert "<td>vision</td>" in html and "<td>robotics</td>" in html


@pytest.mark.parametrize("url", ["/usage/", "/admin/quotas/usagereport/"])
def test_a_team_the_viewer_is_not_in_is_a_404_that_says_so(url, manager, teams):
    make_user("dave", teams["robotics"], "manager")
    response = admin_client(manager).get(url, {"team": "robotics"})
    assert response.status_code == 404
    assert "you are not a member of a team named &#x27;robotics&#x27;" in response.content.decode()
    assert admin_client(manager).get(url, {"team": "nosuch"}).status_code == 404
