"""A continued job's page in a real browser: its progress starts at the checkpoint it continues."""

from __future__ import annotations

import pytest

from tests.jobs.factories import make_job

from .conftest import screenshot, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_continuation_that_ended_before_its_first_new_epoch_shows_the_checkpoints_epoch(live_portal, page,
                                                                                         alice, teams):
    """The page read "epoch 0 of 150 done" once such a job ended (its curves have no point of their own,
    and the last curve epoch replaced the server's epochs_done), beside "Weights (epoch 23)"."""
    _, web = live_portal
    job = make_job(team=teams["vision"], user=alice, state="timed_out", task_name="parts-cancel", epochs_done=23)
    job.spec = {**job.spec, "train_args": {**job.spec["train_args"], "epochs": 150},
                "continued_from": {"job": str(job.pk), "task_name": "parts-cancel", "epoch": 23}}
    job.save(update_fields=["spec"])

    sign_in(page, web.url, "alice", "pw-alice")
    page.goto(f"{web.url}/jobs/{job.pk}/")
    page.wait_for_selector("body[data-synced=true]", timeout=15000)
    page.wait_for_timeout(300)  # the redraw after the final sync runs on the next animation frame

    screenshot(page, "continued-job-progress")
    assert page.inner_text("#epoch-text") == "epoch 23 of 150 done"
    assert not page.errors, page.errors
