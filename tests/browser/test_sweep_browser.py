"""A sweep's page and the submit form's sweep tab in a real browser (Chromium via Playwright)."""

from __future__ import annotations

import re

import pytest

from apps.jobs.models import ACTIVE_STATES, Job, JobState
from apps.sweeps.models import Trial
from apps.sweeps.services import sweeps_advance
from tests.integration.live import wait_for
from tests.sweeps.conftest import finish, report, start, submit_sweep, train, trial_jobs

from .conftest import screenshot, sign_in
from .test_portal_browser import in_thread

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
SWEEP_URL = re.compile(r".*/jobs/[0-9a-f-]{36}/$")


def finished_sweep(user, node) -> Job:
    """Four trials one at a time, median pruning: 0 and 1 complete, 2 lags and is pruned at epoch 2,
    3 completes best; the sweep registers trial 3."""
    parent = submit_sweep(user, epochs=3, method="grid", parallel=1,
                          parameters={"lr0": [0.01, 0.001, 0.1, 0.02], "optimizer": ["SGD"]},
                          prune={"method": "median", "startup_trials": 2, "warmup_epochs": 0})
    for curve in ([0.30, 0.40, 0.50], [0.20, 0.30, 0.40]):
        sweeps_advance()
        (job,) = trial_jobs(parent, *ACTIVE_STATES)
        train(job, node, curve)
    sweeps_advance()
    (lagging,) = trial_jobs(parent, *ACTIVE_STATES)
    lagging = start(lagging, node)
    report(lagging, 1, 0.26)
    report(lagging, 2, 0.20)
    sweeps_advance()
    finish(lagging, "cancelled")
    sweeps_advance()
    (last,) = trial_jobs(parent, *ACTIVE_STATES)
    train(last, node, [0.35, 0.50, 0.62])
    sweeps_advance()
    return Job.objects.get(pk=parent.pk)


def test_the_sweep_page_shows_the_trials_the_best_and_the_charts(live_portal, page, alice, node):
    _, web = live_portal
    parent = in_thread(finished_sweep, alice, node)
    assert parent.state == JobState.SUCCEEDED
    sign_in(page, web.url, "alice", "pw-alice")
    page.goto(f"{web.url}/jobs/{parent.pk}/")
    assert page.get_attribute("#state", "data-state") == "succeeded"
    rows = page.locator("#trials tbody tr")
    assert rows.count() == 4
    assert [rows.nth(i).get_attribute("data-state") for i in range(4)] == ["succeeded", "succeeded", "pruned",
                                                                          "succeeded"]
    assert "at epoch 2" in rows.nth(2).inner_text()
    assert "pruned at epoch 2" in rows.nth(2).locator("td[title]").get_attribute("title")
    assert rows.nth(3).get_attribute("class") == "best"
    assert page.inner_text("#best-value") == "0.6200"
    assert page.inner_text("#best-trial") == "#3"
    assert "lr-sweep:v1" in page.inner_text("#best")
    assert page.is_visible("#model-link")
    page.wait_for_function("document.body.dataset.sweepRendered !== undefined")
    assert page.get_attribute("canvas.scatter[data-param='lr0']", "data-points") == "4"  # 3 finished + 1 pruned
    assert page.get_attribute("canvas.scatter[data-param='optimizer']", "data-points") == "4"
    assert page.get_attribute("#best-so-far", "data-points") == "3"
    assert page.get_attribute("#top-curves", "data-lines") == "4"
    assert page.evaluate("window.sweepPage.charts['lr0'].options.scales.x.type") == "logarithmic"  # 0.001 … 0.1
    assert page.evaluate("window.sweepPage.charts['optimizer'].options.scales.x.type") == "category"
    screenshot(page, "30-sweep-page")
    page.click("#trials tbody tr[data-number='2'] a")
    page.wait_for_selector("#trial-of")
    assert "Trial 2 of the sweep lr-sweep" in page.inner_text("#trial-of")
    assert "pruned at epoch 2" in page.inner_text("#trial-of")
    assert page.errors == []


def zero_scored_sweep(user, node) -> Job:
    """Two trials that both score 0 every epoch (a short demo run on CPU does)."""
    parent = submit_sweep(user, epochs=2, method="grid", parallel=1,
                          parameters={"lr0": [0.01, 0.001], "optimizer": ["SGD"]})
    for _ in range(2):
        sweeps_advance()
        (job,) = trial_jobs(parent, *ACTIVE_STATES)
        train(job, node, [0.0, 0.0])
    sweeps_advance()
    return Job.objects.get(pk=parent.pk)


def test_the_metric_axes_run_from_0_to_1_when_every_trial_scored_0(live_portal, page, alice, node):
    """The charts' metric axis ran from -1 to 1 (mAP is 0 to 1; new-user trial)."""
    _, web = live_portal
    parent = in_thread(zero_scored_sweep, alice, node)
    sign_in(page, web.url, "alice", "pw-alice")
    page.goto(f"{web.url}/jobs/{parent.pk}/")
    page.wait_for_function("document.body.dataset.sweepRendered !== undefined")
    for key in ("lr0", "best-so-far", "top-curves"):
        bounds = page.evaluate(f"(s => [s.min, s.max])(window.sweepPage.charts['{key}'].scales.y)")
        assert bounds == [0, 1], key
    assert page.errors == []


def test_a_sweep_from_the_sweep_tab_fills_in_live_and_cancels_with_its_trials(live_portal, page, alice, node):
    _, web = live_portal
    sign_in(page, web.url, "alice", "pw-alice")
    page.goto(f"{web.url}/jobs/new/")
    page.click("#sweep-tab")
    assert page.is_visible("#sweep")
    page.fill("#id_s-task_name", "tab-sweep")
    page.fill("#id_s-dataset", "demo")
    page.fill("#id_s-epochs", "2")
    page.fill("#id_s-imgsz", "64")
    assert page.input_value("#id_s-p1_name") == "lr0" and page.is_checked("#id_s-p1_log")
    page.fill("#id_s-p1_low", "-1")
    page.fill("#id_s-p2_name", "optimizer")
    page.fill("#id_s-p2_choices", "SGD, AdamW")
    page.fill("#id_s-trials", "3")
    page.click("#sweep-submit")
    page.wait_for_selector("#field-s-p1_low .field-error")
    assert "between 0 and 10" in page.inner_text("#field-s-p1_low .field-error")
    assert page.is_visible("#sweep")  # the sweep tab stays open with the error at its cell
    page.fill("#id_s-p1_low", "1e-4")
    page.click("#sweep-submit")
    page.wait_for_url(SWEEP_URL)
    assert page.get_attribute("#state", "data-state") == "running"
    assert "no trial submitted yet" in page.inner_text("#trials")
    parent = Job.objects.get(task_name="tab-sweep")
    assert parent.spec["sweep"]["parameters"]["optimizer"]["choices"] == ["SGD", "AdamW"]
    assert parent.spec["train_args"]["optimizer"] == "SGD"  # the form's Optimizer field (auto ignores lr0)

    in_thread(sweeps_advance)  # what the scheduler's next pass does
    page.wait_for_function("document.querySelectorAll('#trials tbody tr[data-state=queued]').length === 2",
                           timeout=20_000)
    assert page.inner_text("#submitted") == "2"
    screenshot(page, "31-sweep-live")
    page.click("#cancel-button")
    page.wait_for_selector("#state[data-state='cancelled']")
    # The pill can turn before the trials do: sweep_cancel commits the parent first, then cancels
    # each trial, and the page's poll may land in between (it renders the parent's state).
    wait_for(lambda: {j.state for j in trial_jobs(parent)} == {JobState.CANCELLED}, 10, what="the trials cancelled")
    assert Trial.objects.filter(sweep=parent).count() == 2
    assert page.errors == []
