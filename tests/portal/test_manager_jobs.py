"""A team manager's view of the portal (trial 14, F14): the team's work on the dashboard and the
job list, and the job page's Requeue and Change class (the API's and admin's rules)."""

from __future__ import annotations

import pytest
from django.test import Client

from apps.accounts.models import AuditEntry
from apps.jobs.models import Job, JobState
from tests.jobs.factories import make_job

pytestmark = pytest.mark.django_db


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]] if response.context else []


def test_a_managers_dashboard_lists_the_teams_running_and_queued_jobs(alice, bob, carol, teams):
    make_job(team=teams["vision"], user=bob, task_name="bobs-queued")
    make_job(team=teams["vision"], user=bob, state=JobState.RUNNING, task_name="bobs-running")
    make_job(team=teams["vision"], user=bob, state=JobState.SUCCEEDED, task_name="bobs-done")
    make_job(team=teams["robotics"], user=carol, task_name="carols-queued")
    html = signed_in(alice).get("/").content.decode()
    section = html.split('id="team-jobs"', 1)[1]
    assert "bobs-queued" in section and "bobs-running" in section and "vision" in section
    assert "bobs-done" not in html and "carols-queued" not in html
    make_job(team=teams["vision"], user=alice, task_name="alices-queued")
    as_member = signed_in(bob).get("/").content.decode()  # a member has no team section
    assert "team-jobs" not in as_member and "alices-queued" not in as_member


def test_the_job_list_opens_on_the_teams_jobs_for_a_manager_and_on_mine_for_a_member(alice, bob, teams):
    make_job(team=teams["vision"], user=bob, task_name="bobs-queued")
    make_job(team=teams["vision"], user=alice, task_name="alices-queued")
    as_manager = signed_in(alice).get("/jobs/").content.decode()
    assert "bobs-queued" in as_manager and "alices-queued" in as_manager
    assert "the default for a team manager" in as_manager
    as_member = signed_in(bob).get("/jobs/").content.decode()
    assert "bobs-queued" in as_member and "alices-queued" not in as_member
    mine = signed_in(alice).get("/jobs/?scope=mine").content.decode()
    assert "alices-queued" in mine and "bobs-queued" not in mine


def test_the_job_page_offers_requeue_to_a_manager_not_to_the_owner(alice, bob, teams):
    job = make_job(team=teams["vision"], user=bob, state=JobState.RUNNING)
    assert 'id="requeue-button"' in signed_in(alice).get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="requeue-button"' not in signed_in(bob).get(f"/jobs/{job.pk}/").content.decode()


def test_a_manager_requeues_a_running_job_from_its_page_and_it_is_audited(alice, bob, teams):
    job = make_job(team=teams["vision"], user=bob, state=JobState.RUNNING)
    response = signed_in(alice).post(f"/jobs/{job.pk}/requeue/", follow=True)
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
    # No checkpoint yet: it starts over, and says so (it said "resumes from its last checkpoint").
    assert "Requeued: it has no checkpoint yet, so it starts over when it starts again." in messages_of(response)
    assert AuditEntry.objects.filter(action="job.requeue", actor=alice, target_id=str(job.pk)).exists()
    from apps.jobs.models import Checkpoint

    job = make_job(team=teams["vision"], user=bob, state=JobState.RUNNING)
    Checkpoint.objects.create(job=job, attempt=1, epoch=4, path="x", sha256="0" * 64, size=1)
    response = signed_in(alice).post(f"/jobs/{job.pk}/requeue/", follow=True)
    assert "Requeued: it resumes from its checkpoint of epoch 4 when it starts again." in messages_of(response)


def test_the_owner_cannot_requeue_from_the_page_as_in_the_api(bob, alice, teams):
    job = make_job(team=teams["vision"], user=bob, state=JobState.RUNNING)
    response = signed_in(bob).post(f"/jobs/{job.pk}/requeue/", follow=True)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    assert any("Only a manager" in m for m in messages_of(response))


def test_a_queued_job_is_not_requeued_and_the_message_names_the_state(alice, bob, teams):
    job = make_job(team=teams["vision"], user=bob)
    response = signed_in(alice).post(f"/jobs/{job.pk}/requeue/", follow=True)
    assert any(m.startswith("state: the job is queued") for m in messages_of(response))


def test_a_manager_changes_a_queued_jobs_class_from_its_page_and_it_is_audited(alice, bob, teams):
    job = make_job(team=teams["vision"], user=bob)
    client = signed_in(alice)
    assert 'id="class-form"' in client.get(f"/jobs/{job.pk}/").content.decode()
    response = client.post(f"/jobs/{job.pk}/class/", {"priority_class": "high"}, follow=True)
    job.refresh_from_db()
    assert job.priority_class == "high"
    assert any("from medium to high" in m for m in messages_of(response))
    entry = AuditEntry.objects.get(action="job.class", target_id=str(job.pk))
    assert entry.actor == alice and entry.data == {"from": "medium", "to": "high"}
    assert job.events.filter(kind="class_changed").exists()


def test_the_owner_cannot_change_the_class(bob, alice, teams):
    job = make_job(team=teams["vision"], user=bob)
    assert 'id="class-form"' not in signed_in(bob).get(f"/jobs/{job.pk}/").content.decode()
    response = signed_in(bob).post(f"/jobs/{job.pk}/class/", {"priority_class": "urgent"}, follow=True)
    assert Job.objects.get(pk=job.pk).priority_class == "medium"
    assert any("Only a manager" in m for m in messages_of(response))


@pytest.mark.parametrize("value", ["", "critical", "URGENT"])
def test_a_bad_class_is_named_and_changes_nothing(value, alice, bob, teams):
    job = make_job(team=teams["vision"], user=bob)
    response = signed_in(alice).post(f"/jobs/{job.pk}/class/", {"priority_class": value}, follow=True)
    assert Job.objects.get(pk=job.pk).priority_class == "medium"
    assert any(m.startswith("priority_class: must be one of low, medium, high, urgent") for m in messages_of(response))


def test_a_running_jobs_class_is_not_changed(alice, bob, teams):
    job = make_job(team=teams["vision"], user=bob, state=JobState.RUNNING)
    response = signed_in(alice).post(f"/jobs/{job.pk}/class/", {"priority_class": "high"}, follow=True)
    assert Job.objects.get(pk=job.pk).priority_class == "medium"
    assert any("only a queued job changes class" in m for m in messages_of(response))
