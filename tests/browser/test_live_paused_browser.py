"""The job page through a Redis outage, in a real browser: the socket closes with 1013, the page
says live updates are paused and keeps what it shows, and goes live again once Redis is back."""

from __future__ import annotations

import pytest

from apps.jobs.models import JobState
from apps.jobs.services import job_transition, metrics_record
from tests.portal.helpers import submit

from .conftest import screenshot, sign_in
from .test_portal_browser import in_thread

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CONN = "document.getElementById('conn').textContent"


def test_the_job_page_pauses_live_updates_while_redis_is_away_and_goes_live_again(
        live_portal, page, alice, node, redis_server):
    _, web = live_portal
    job = submit(alice, task_name="outage-page")
    job_transition(job.pk, expected=[JobState.QUEUED], to=JobState.RUNNING, node=node, gpu_indices=[0])
    in_thread(metrics_record, job, epoch=1, values={"train/box_loss": 3.0})
    sign_in(page, web.url, "alice", "pw-alice")
    page.goto(f"{web.url}/jobs/{job.pk}/")
    page.wait_for_function("window.jobPage.live()")
    assert page.evaluate(CONN) == "live"

    redis_server.kill()
    try:
        # The open socket's receive loop loses Redis and closes 1013; each retry gets the stored
        # history and 1013 again while Redis is away.
        page.wait_for_function(f"{CONN}.startsWith('live updates paused')", timeout=30_000)
        screenshot(page, "12-live-updates-paused")
        assert page.evaluate("window.jobPage.epochs()") == [1], "what the page showed stays"
        assert page.evaluate("window.jobPage.state()") == "running"
    finally:
        redis_server.start()

    # Back: the next retry (5-15 s apart while paused) is accepted and stays open.
    page.wait_for_function("window.jobPage.live()", timeout=45_000)
    assert page.evaluate(CONN) == "live"
    assert page.evaluate("window.jobPage.stats.reconnects") >= 1
    in_thread(metrics_record, job, epoch=2, values={"train/box_loss": 2.0})
    page.wait_for_function("window.jobPage.epochs().length === 2", timeout=15_000)
    assert page.evaluate("window.jobPage.metric(2)") == {"train/box_loss": 2.0}
    assert page.errors == []
