"""The audit log: who did what, readable by the managers of the team it concerns."""

from __future__ import annotations

import pytest

from apps.accounts.models import AuditEntry
from apps.accounts.services import audit_record, membership_set, user_ensure
from apps.jobs.models import JobState
from tests.conftest import SEED_SPEC, api_client
from tests.jobs.factories import make_job

pytestmark = pytest.mark.django_db


def actions(user, **query) -> list[str]:
    response = api_client(user).get("/api/v1/audit/", query)
    assert response.status_code == 200, response.content
    return [e["action"] for e in response.json()["results"]]


def test_submit_cancel_and_requeue_are_recorded(alice, bob, teams, demo_registered):
    job_id = api_client(bob).post("/api/v1/jobs/", SEED_SPEC, content_type="application/yaml").json()["id"]
    api_client(bob).post(f"/api/v1/jobs/{job_id}/cancel/")
    running = make_job(team=teams["vision"], user=bob, state=JobState.RUNNING)
    api_client(alice).post(f"/api/v1/jobs/{running.pk}/requeue/")
    entries = AuditEntry.objects.filter(team=teams["vision"]).order_by("id")
    assert [(e.actor_name, e.action) for e in entries if e.action.startswith("job.")] == [
        ("bob", "job.submit"), ("bob", "job.cancel"), ("alice", "job.requeue")]
    assert entries.filter(action="job.submit").get().target_id == job_id


def test_role_changes_are_recorded_with_before_and_after(alice, bob, teams):
    membership_set(user=bob, team=teams["vision"], role="manager", by=alice)
    entry = AuditEntry.objects.filter(action="role.change", data__user="bob").latest("id")
    assert (entry.actor_name, entry.data["from"], entry.data["to"]) == ("alice", "member", "manager")


def test_setting_the_same_role_again_records_nothing(alice, bob, teams):
    before = AuditEntry.objects.count()
    membership_set(user=bob, team=teams["vision"], role="member", by=alice)
    assert AuditEntry.objects.count() == before


def test_a_quota_change_can_be_recorded_by_any_service(alice, teams):
    audit_record(actor=alice, action=AuditEntry.Action.QUOTA_CHANGE, team=teams["vision"],
                 message="gpu_hours_per_day 20 → 40", data={"from": 20, "to": 40})
    assert "quota.change" in actions(alice)


def test_a_manager_reads_their_teams_entries_only(alice, carol, teams):
    make_job(team=teams["robotics"], user=carol)
    audit_record(actor=carol, action="job.submit", team=teams["robotics"])
    audit_record(actor=alice, action="job.cancel", team=teams["vision"])
    body = api_client(alice).get("/api/v1/audit/").json()["results"]
    assert {e["team"] for e in body if e["team"]} == {"vision"}
    refused = api_client(alice).get("/api/v1/audit/?team=robotics")
    assert refused.status_code == 400 and refused.json() == {"team": ["you are not a manager of a team named 'robotics'"]}


def test_a_member_sees_only_their_own_token_history(bob, alice, teams):
    audit_record(actor=alice, action="job.cancel", team=teams["vision"])
    api_client(bob).post("/api/v1/tokens/", {"name": "mine"}, format="json")
    entries = api_client(bob).get("/api/v1/audit/").json()["results"]
    assert entries and all(e["team"] is None and e["actor"] == "bob" for e in entries)
    assert {e["action"] for e in entries} == {"token.create"}


def test_an_admin_reads_everything(alice, carol, teams):
    audit_record(actor=carol, action="job.submit", team=teams["robotics"])
    audit_record(actor=alice, action="job.submit", team=teams["vision"])
    root = user_ensure(username="root", password="pw", superuser=True)
    assert {e["team"] for e in api_client(root).get("/api/v1/audit/?action=job.submit").json()["results"]} == {
        "vision", "robotics"}


def test_an_unknown_action_filter_names_the_parameter(alice):
    response = api_client(alice).get("/api/v1/audit/?action=drop.tables")
    assert response.status_code == 400 and "action" in response.json()


def test_entries_outlive_their_actor(alice, teams):
    user = user_ensure(username="temp", password="pw")
    audit_record(actor=user, action="job.submit", team=teams["vision"])
    user.delete()
    entry = AuditEntry.objects.get(actor_name="temp")
    assert entry.actor is None
