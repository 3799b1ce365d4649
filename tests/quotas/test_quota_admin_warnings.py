"""A team quota that makes some of the team's jobs impossible says so when it is saved (manager trial
15, F12: max GPUs 0.5 under the site's urgent max of 2 saved without a word)."""

from __future__ import annotations

import pytest

from apps.quotas.models import TeamQuota
from tests.conftest import admin_client
from tests.jobs.factories import make_job

pytestmark = pytest.mark.django_db

ADD = "/admin/quotas/teamquota/add/"


def save_quota(client, team, **values) -> list[str]:
    data = {"team": str(team.pk), **{name: str(value) for name, value in values.items()}}
    response = client.post(ADD, data, follow=True)
    assert TeamQuota.objects.filter(team=team).exists(), response.context["adminform"].form.errors
    return [str(m) for m in response.context["messages"]]


def test_a_max_below_one_gpu_and_below_the_urgent_max_in_force_is_saved_with_both_warnings(superuser, bob, teams):
    make_job(team=teams["vision"], user=bob, task_name="one-gpu", gpus=1)
    make_job(team=teams["vision"], user=bob, task_name="half", gpus=0.5)
    said = " | ".join(save_quota(admin_client(superuser), teams["vision"], max_gpus=0.5))
    assert ("max GPUs 0.5 is below the urgent max GPUs in force, 2 (site default): vision holds at most 0.5 GPUs "
            "at once, urgent jobs included") in said
    assert ("max GPUs 0.5: a job of vision that needs more than 0.5 GPUs (any 1-GPU job) can never start; "
            "1 of its queued jobs needs more and waits until max GPUs is raised") in said


def test_a_max_that_fits_every_queued_job_and_the_urgent_max_says_nothing_more(superuser, bob, teams):
    make_job(team=teams["vision"], user=bob, gpus=2)
    said = save_quota(admin_client(superuser), teams["vision"], max_gpus=4)
    assert not [m for m in said if "max GPUs" in m], said


def test_a_max_below_a_queued_jobs_need_names_how_many_wait(superuser, bob, teams):
    make_job(team=teams["vision"], user=bob, gpus=4)
    said = save_quota(admin_client(superuser), teams["vision"], max_gpus=3, urgent_max_gpus=1)
    assert said[0].startswith("max GPUs 3: a job of vision that needs more than 3 GPUs can never start; "
                              "1 of its queued jobs needs more"), said


def test_zero_user_gpu_hours_per_day_is_saved_with_a_warning_that_it_stops_the_team(superuser, teams):
    """It saved without a word (the warnings looked at max GPUs only), and every member's job then waited."""
    said = save_quota(admin_client(superuser), teams["vision"], user_gpu_hours_per_day=0)
    assert ("user GPU-hours per day 0: no member of vision may start a job until it is raised or emptied "
            "(empty = the site default)") in said, said
