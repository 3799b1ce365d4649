"""Who may cancel a job, written once in jobs.selectors (the API and the pages both ask it)."""

from __future__ import annotations

import pytest

from apps.jobs.selectors import job_may_cancel

from .factories import make_job

pytestmark = pytest.mark.django_db


def test_the_owner_and_a_manager_of_the_team_may_cancel_a_teammate_and_an_outsider_may_not(alice, bob, carol, teams):
    bobs = make_job(team=teams["vision"], user=bob)
    assert job_may_cancel(user=bob, job=bobs)  # the owner
    assert job_may_cancel(user=alice, job=bobs)  # vision manager
    assert not job_may_cancel(user=carol, job=bobs)  # robotics member
    alices = make_job(team=teams["vision"], user=alice)
    assert not job_may_cancel(user=bob, job=alices)  # a teammate, not a manager
