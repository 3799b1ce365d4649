"""A manager changes a sweep's class: its queued trials move with it and its later trials are
submitted in it (manager trial 15, F23: "the job is a sweep; only a queued job changes class")."""

from __future__ import annotations

import pytest

from apps.accounts.models import AuditEntry, Team
from apps.jobs.models import JobEvent, JobState
from apps.sweeps.services import sweeps_advance
from tests.conftest import admin_client, api_client

from .conftest import start, submit_sweep, train, trial_jobs

pytestmark = pytest.mark.django_db


@pytest.fixture
def bobs_sweep(sweeper, bob):
    """bob's three-trial sweep, one trial at a time; its first trial queued."""
    parent = submit_sweep(bob, parameters={"lr0": [0.01, 0.005, 0.001]}, method="grid", parallel=1)
    sweeps_advance()
    return parent


def test_a_manager_raises_a_sweep_with_its_queued_trial_and_its_later_ones(bobs_sweep, alice, node):
    (first,) = trial_jobs(bobs_sweep, JobState.QUEUED)
    response = api_client(alice).post(f"/api/v1/jobs/{bobs_sweep.pk}/class/", {"priority": "high"}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["priority_class"] == "high"
    first.refresh_from_db()
    assert first.priority_class == "high"
    assert JobEvent.objects.filter(job=first, kind="class_changed", message__contains="with its sweep").exists()
    entry = AuditEntry.objects.get(action=AuditEntry.Action.JOB_CLASS, target_id=str(bobs_sweep.pk))
    assert entry.data == {"from": "medium", "to": "high", "trials": [str(first.pk)]}
    train(first, node, [0.1, 0.2])
    sweeps_advance()
    (second,) = trial_jobs(bobs_sweep, JobState.QUEUED)
    assert second.priority_class == "high"


def test_a_running_trial_keeps_its_class(bobs_sweep, alice, node):
    (first,) = trial_jobs(bobs_sweep, JobState.QUEUED)
    start(first, node)
    response = api_client(alice).post(f"/api/v1/jobs/{bobs_sweep.pk}/class/", {"priority": "low"}, format="json")
    assert response.status_code == 200, response.content
    first.refresh_from_db()
    assert first.priority_class == "medium"


def test_an_urgent_sweep_submits_urgent_trials_where_only_managers_submit_urgent(bobs_sweep, alice, node, teams):
    Team.objects.filter(pk=teams["vision"].pk).update(urgent_by=Team.UrgentBy.MANAGERS)
    response = api_client(alice).post(f"/api/v1/jobs/{bobs_sweep.pk}/class/", {"priority": "urgent"}, format="json")
    assert response.status_code == 200, response.content
    train(trial_jobs(bobs_sweep, JobState.QUEUED)[0], node, [0.1, 0.2])
    sweeps_advance()
    (second,) = trial_jobs(bobs_sweep, JobState.QUEUED)  # submitted as bob, a member, yet urgent: alice's class
    assert second.priority_class == "urgent"


def test_a_member_and_an_ended_sweep_are_refused(bobs_sweep, alice, bob):
    response = api_client(bob).post(f"/api/v1/jobs/{bobs_sweep.pk}/class/", {"priority": "high"}, format="json")
    assert response.status_code == 403
    type(bobs_sweep).objects.filter(pk=bobs_sweep.pk).update(state=JobState.CANCELLED)
    response = api_client(alice).post(f"/api/v1/jobs/{bobs_sweep.pk}/class/", {"priority": "high"}, format="json")
    assert response.status_code == 409  # as requeue/ and cancel/ answer a job in the wrong state (CI trial 17, H12)
    assert response.json() == {"state": ["the sweep is cancelled; it submits no more trials"]}


def test_the_sweep_page_offers_the_class_to_a_manager_only(bobs_sweep, alice, bob):
    assert 'id="class-form"' in admin_client(alice).get(f"/jobs/{bobs_sweep.pk}/").content.decode()
    assert 'id="class-form"' not in admin_client(bob).get(f"/jobs/{bobs_sweep.pk}/").content.decode()
    response = admin_client(alice).post(f"/jobs/{bobs_sweep.pk}/class/", {"priority_class": "low"}, follow=True)
    assert "Class changed from medium to low." in response.content.decode()
