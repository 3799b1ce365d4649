"""The job page says live, without a reload, that an urgent job was placed as high: beyond its team's
urgent allowance (trial31 left: the note came only with the server-rendered page)."""

from __future__ import annotations

import pytest

from apps.quotas.models import TeamQuota
from apps.scheduling.loop import plan_and_start
from tests.jobs.factories import make_job

from .conftest import sign_in
from .test_portal_browser import in_thread

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_job_page_says_live_that_an_urgent_job_runs_as_high(live_portal, page, alice, teams, node):
    _, web = live_portal
    TeamQuota.objects.update_or_create(team=teams["vision"], defaults={"urgent_gpu_hours_per_day": 0.0001})
    job = make_job(team=teams["vision"], user=alice, priority_class="urgent")
    sign_in(page, web.url, "alice", "pw-alice")
    page.goto(f"{web.url}/jobs/{job.pk}/")
    page.wait_for_function("window.jobPage.live()")
    assert not page.is_visible("#run-class")

    assert in_thread(plan_and_start)  # the real pass: the team's urgent GPU-hours are below its timeout

    page.wait_for_function("window.jobPage.state() === 'starting'", timeout=15_000)
    page.wait_for_selector("#run-class:not(.hidden)", timeout=5_000)
    assert page.inner_text("#run-class").strip() == "· runs as high: beyond the team's urgent allowance"
    assert page.inner_text("#priority-class") == "urgent"
    assert page.errors == []
