"""State changes are conditional updates: only from the expected states, fenced by attempt id."""

from __future__ import annotations

import uuid

import pytest

from apps.jobs.models import Job, JobState
from apps.jobs.services import job_cancel, job_requeue, job_transition

from .factories import make_job

pytestmark = pytest.mark.django_db


def state_of(job) -> str:
    return Job.objects.values_list("state", flat=True).get(pk=job.pk)


def test_it_moves_a_job_from_an_expected_state(alice, teams):
    job = make_job(team=teams["vision"], user=alice)
    assert job_transition(job.pk, expected=[JobState.QUEUED], to=JobState.STARTING)
    assert state_of(job) == JobState.STARTING


def test_it_refuses_to_move_a_job_from_another_state(alice, teams):
    job = make_job(team=teams["vision"], user=alice, state=JobState.SUCCEEDED)
    assert not job_transition(job.pk, expected=[JobState.RUNNING], to=JobState.FAILED)
    assert state_of(job) == JobState.SUCCEEDED


def test_only_the_first_of_two_racing_transitions_wins(alice, teams):
    job = make_job(team=teams["vision"], user=alice)
    first = job_transition(job.pk, expected=[JobState.QUEUED], to=JobState.STARTING)
    second = job_transition(job.pk, expected=[JobState.QUEUED], to=JobState.CANCELLED)
    assert (first, second) == (True, False)
    assert state_of(job) == JobState.STARTING


def test_a_stale_attempt_id_is_fenced_off(alice, teams):
    job = make_job(team=teams["vision"], user=alice, state=JobState.RUNNING)
    assert not job_transition(job.pk, expected=[JobState.RUNNING], to=JobState.SUCCEEDED, attempt_id=uuid.uuid4())
    assert job_transition(job.pk, expected=[JobState.RUNNING], to=JobState.SUCCEEDED, attempt_id=job.attempt_id)


def test_a_terminal_transition_stamps_finished_at_and_clears_the_queue_fields(alice, teams):
    job = make_job(team=teams["vision"], user=alice, queue_position=3)
    job_transition(job.pk, expected=[JobState.QUEUED], to=JobState.CANCELLED)
    job.refresh_from_db()
    assert job.finished_at is not None and job.queue_position is None


def test_a_requeue_starts_a_new_attempt_and_fences_the_old_one(alice, teams):
    job = make_job(team=teams["vision"], user=alice, state=JobState.RUNNING)
    old_attempt = job.attempt_id
    assert job_requeue(job, reason="node lost")
    job.refresh_from_db()
    assert (job.state, job.attempt) == (JobState.QUEUED, 2) and job.attempt_id != old_attempt
    assert not job_transition(job.pk, expected=[JobState.QUEUED], to=JobState.STARTING, attempt_id=old_attempt)


def test_a_requeue_with_a_stale_attempt_does_nothing(alice, teams):
    job = make_job(team=teams["vision"], user=alice, state=JobState.RUNNING)
    stale = Job.objects.get(pk=job.pk)
    job_requeue(job, reason="first")
    assert not job_requeue(stale, reason="second")
    assert Job.objects.get(pk=job.pk).attempt == 2


def test_a_queued_job_cannot_be_requeued(alice, teams):
    job = make_job(team=teams["vision"], user=alice)
    assert not job_requeue(job, reason="no")


def test_cancel_ends_a_queued_job_at_once(alice, teams):
    job = make_job(team=teams["vision"], user=alice)
    assert job_cancel(job=job, by=alice)
    assert state_of(job) == JobState.CANCELLED


def test_a_job_that_left_the_queue_no_longer_says_why_it_waits(alice, teams):
    """A cancelled queued job read "Why it waits: …; expected 18:09 UTC" on its page and in the
    API (manager trial 15, F22): an ended job forgets the queue's answers."""
    from django.test import Client

    job = make_job(team=teams["vision"], user=alice, reason="waiting for 1 GPU on one node; expected 18:09 UTC",
                   queue_position=3)
    assert job_cancel(job=job, by=alice)
    job.refresh_from_db()
    assert (job.reason, job.queue_position) == ("", None)
    client = Client()
    client.force_login(alice)
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert '<dt class="queued-only hidden">Why it waits</dt>' in html


def test_cancel_of_a_running_job_only_asks_its_worker(alice, teams):
    job = make_job(team=teams["vision"], user=alice, state=JobState.RUNNING)
    assert job_cancel(job=job, by=alice)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and job.cancel_requested_at is not None
    assert not job_cancel(job=job, by=alice), "a second request changes nothing"


def test_cancel_of_a_finished_job_changes_nothing(alice, teams):
    job = make_job(team=teams["vision"], user=alice, state=JobState.FAILED)
    assert not job_cancel(job=job, by=alice)
    assert state_of(job) == JobState.FAILED
