"""The portal in a real browser: sign in, submit, watch the curves arrive live, cancel."""

from __future__ import annotations

import re

import pytest

from apps.jobs.models import Job, JobState, MetricPoint
from apps.jobs.services import job_transition, metrics_record, seq_allocate
from tests.portal.helpers import submit

from .conftest import screenshot, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

JOB_URL = re.compile(r".*/jobs/[0-9a-f-]{36}/$")


def in_thread(function, *args, **kwargs):
    """Run outside Playwright's event loop (async_to_sync, used by the publisher, refuses to run inside it)."""
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connections

    def call():
        try:
            return function(*args, **kwargs)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(call).result()


def chart_points(page, chart: str = "loss-chart") -> int:
    return int(page.get_attribute(f"#{chart}", "data-points") or 0)


def test_every_page_renders_without_script_errors_and_signs_out(live_portal, page, alice, node):
    _, web = live_portal
    page.goto(f"{web.url}/accounts/login/")
    screenshot(page, "01-sign-in")
    sign_in(page, web.url, "alice", "pw-alice")
    for path, name in [("/", "02-dashboard-idle"), ("/jobs/", "03-jobs-empty"), ("/usage/", "04-usage"), ("/teams/", "04b-teams"),
                       ("/models/", "05-models-empty"), ("/tokens/", "06-tokens")]:
        page.goto(web.url + path)
        page.wait_for_load_state("networkidle")
        screenshot(page, name)
    assert page.errors == []
    page.click("header .logout button")
    page.wait_for_url(f"{web.url}/accounts/login/")


def test_a_gap_in_the_live_numbers_is_refetched_over_rest(live_portal, page, alice, node):
    """A dropped epoch message (written, never published) shows up once the next one reveals the gap."""
    _, web = live_portal
    job = submit(alice, task_name="gap")
    job_transition(job.pk, expected=[JobState.QUEUED], to=JobState.RUNNING, node=node, gpu_indices=[0])
    sign_in(page, web.url, "alice", "pw-alice")
    page.goto(f"{web.url}/jobs/{job.pk}/")
    page.wait_for_function("window.jobPage.live()")  # history sent: what follows is live

    dropped = seq_allocate(job.pk)
    MetricPoint.objects.create(job=job, epoch=1, attempt=1, seq=dropped, values={"train/box_loss": 2.0})
    in_thread(metrics_record, job, epoch=2, values={"train/box_loss": 1.0})

    page.wait_for_function("window.jobPage.epochs().length === 2", timeout=10_000)
    stats = page.evaluate("window.jobPage.stats")
    assert stats["gaps"] == 1 and stats["refetched"] == 1
    assert page.evaluate("window.jobPage.metric(1)") == {"train/box_loss": 2.0}
    assert page.evaluate("window.jobPage.state()") == "running"  # not the end-of-job resync
    assert page.errors == []


@pytest.mark.integration
def test_submit_watch_the_curves_live_and_cancel_a_second_job(live_portal, page, alice):
    live, web = live_portal
    live.start_scheduler()
    live.start_worker()
    sign_in(page, web.url, "alice", "pw-alice")

    # 1. A bad value is shown at its field; fixing it submits and lands on the job page.
    page.goto(f"{web.url}/jobs/new/")
    page.fill("#id_f-task_name", "browser-run")
    page.fill("#id_f-dataset", "demo")
    page.fill("#id_f-epochs", "ten")
    page.fill("#id_f-imgsz", "128")
    page.fill("#id_f-batch", "8")
    page.click("#common button[type=submit]")
    error = page.locator("#field-f-epochs .field-error")
    assert error.inner_text() == "must be an integer, got 'ten'"
    screenshot(page, "07-submit-error-at-field")
    assert not Job.objects.exists()
    page.fill("#id_f-epochs", "3")
    page.click("#common button[type=submit]")
    page.wait_for_url(JOB_URL)
    job = Job.objects.get()

    # 2. The loss chart gains points over the socket while the job runs.
    page.wait_for_function("Number(document.getElementById('loss-chart').dataset.points) >= 1", timeout=180_000)
    assert page.evaluate("window.jobPage.stats.refetched") == 0, "the first point came over the socket"
    screenshot(page, "08-job-running")
    page.evaluate("window.jobPage.drop()")  # a lost connection: it reconnects and catches up
    page.wait_for_function("document.body.dataset.synced === 'true'", timeout=180_000)
    assert Job.objects.get(pk=job.pk).state == JobState.SUCCEEDED

    # 3. The chart ends equal to the database.
    stored = {p.epoch: p.values for p in MetricPoint.objects.filter(job=job)}
    assert page.evaluate("window.jobPage.epochs()") == sorted(stored) == [1, 2, 3]
    for epoch, values in stored.items():
        assert page.evaluate(f"window.jobPage.metric({epoch})") == values
    assert chart_points(page, "loss-chart") == chart_points(page, "map-chart") == 3
    assert page.evaluate("window.jobPage.stats.reconnects") >= 1
    page.wait_for_selector("#model-link:not(.hidden)")
    assert page.locator("#timeline li[data-kind=succeeded]").count() == 1
    screenshot(page, "09-job-succeeded")

    # 4. A second job, from the YAML tab, cancelled from its page while it runs.
    page.goto(f"{web.url}/jobs/new/")
    page.click("a[data-tab=yaml]")
    page.fill("#id_y-spec_text", 'task_name: long-run\ncommand: "yolo train data=demo model=yolov8n.yaml '
                                 'epochs=200 imgsz=128 batch=8"\nresources: {gpu: 1}\n')
    screenshot(page, "10-submit-yaml")
    page.click("#yaml button[type=submit]")
    page.wait_for_url(JOB_URL)
    page.wait_for_selector("#state[data-state=running]", timeout=120_000)
    page.wait_for_function("document.querySelector('#batch-progress:not(.hidden)') !== null", timeout=120_000)
    screenshot(page, "11-second-job-running")
    page.click("#cancel-button")
    page.wait_for_selector("#state[data-state=cancelled]", timeout=60_000)
    assert Job.objects.get(task_name="long-run").state == JobState.CANCELLED
    screenshot(page, "12-second-job-cancelled")

    for path, name in [("/", "13-dashboard"), ("/jobs/?scope=team", "14-jobs"), ("/models/", "15-models"),
                       ("/usage/", "16-usage")]:
        page.goto(web.url + path)
        page.wait_for_load_state("networkidle")
        screenshot(page, name)
    assert "browser-run" in page.goto(f"{web.url}/models/").text()
    assert page.errors == []


CLOSE_CODE = """(url) => new Promise((resolve) => {
  const socket = new WebSocket(url);
  socket.onclose = (event) => resolve(event.code);
})"""


def test_a_browser_is_told_why_its_socket_is_refused(live_portal, page, alice, carol, node):
    """The refusal codes reach a real client (they did not: a close before the accept is an
    HTTP 403 at the handshake, which a browser reports as 1006, so the job page could not tell
    "sign in" from "no access"): 4401 signed out, 4404 another team's job."""
    _, web = live_portal
    job = submit(alice, task_name="vision-only")
    socket_url = web.url.replace("http", "ws", 1) + f"/ws/jobs/{job.pk}/"
    page.goto(f"{web.url}/accounts/login/")  # same origin, not signed in
    assert page.evaluate(CLOSE_CODE, socket_url) == 4401
    sign_in(page, web.url, "carol", "pw-carol")
    assert page.evaluate(CLOSE_CODE, socket_url) == 4404


def test_a_waiting_jobs_priority_is_whole_points_with_what_it_means(live_portal, page, alice, node):
    """The job page read "medium 23985.333" (a new-user trial): whole points, live, and a tooltip
    saying what the score is and this job's factors."""
    _, web = live_portal
    job = submit(alice, task_name="waiting")
    Job.objects.filter(pk=job.pk).update(priority_score=23985.333, priority_factors={"fairshare": 0.667, "age": 0.0})
    sign_in(page, web.url, "alice", "pw-alice")
    page.goto(f"{web.url}/jobs/{job.pk}/")
    assert page.inner_text("[data-field=priority]") == "23,985"
    Job.objects.filter(pk=job.pk).update(priority_score=31000.5, priority_factors={"fairshare": 1.0, "age": 0.012})
    page.wait_for_function("document.querySelector('[data-field=priority]').textContent === '31,001'",
                           timeout=15000)
    title = page.get_attribute("#priority", "title")
    assert "highest first" in title and title.endswith("This job: fair-share 1.00 · age 0.01.")
    assert page.is_visible("#priority")
    assert page.errors == []


def test_a_manager_changes_a_teammates_queued_job_class_from_its_page(live_portal, page, alice, bob, node):
    """Trial 14, F14: the job page's Change class, in a real browser (its live script stays quiet)."""
    _, web = live_portal
    job = submit(bob, task_name="bobs-waiting")
    sign_in(page, web.url, "alice", "pw-alice")
    page.goto(f"{web.url}/")
    assert "bobs-waiting" in page.inner_text("#team-jobs")
    page.click("#team-jobs a:has-text('bobs-waiting')")
    page.wait_for_url(f"{web.url}/jobs/{job.pk}/")
    page.select_option("#class-select", "high")
    page.click("#class-button")
    page.wait_for_url(f"{web.url}/jobs/{job.pk}/")
    assert "Class changed from medium to high." in page.inner_text(".messages")
    assert Job.objects.get(pk=job.pk).priority_class == "high"
    assert page.errors == []


def test_a_jobs_buttons_go_once_its_state_no_longer_takes_them(live_portal, page, alice, bob, node):
    """Trial 20: a queued job's page kept "Change class" after the job had started and ended, and a
    running job's kept "Requeue" once it had succeeded; each button now leaves with its state."""
    _, web = live_portal
    job = submit(bob, task_name="bobs-job")
    sign_in(page, web.url, "alice", "pw-alice")
    page.goto(f"{web.url}/jobs/{job.pk}/")
    assert page.is_visible("#class-form") and page.is_visible("#cancel-form")
    job_transition(job.pk, expected=[JobState.QUEUED], to=JobState.RUNNING, node=node, gpu_indices=[0])
    page.wait_for_function("window.jobPage.state() === 'running'", timeout=15000)
    assert not page.is_visible("#class-form") and page.is_visible("#cancel-form")
    page.reload()
    assert page.is_visible("#requeue-form")
    job_transition(job.pk, expected=[JobState.RUNNING], to=JobState.SUCCEEDED)
    page.wait_for_function("window.jobPage.state() === 'succeeded'", timeout=15000)
    assert not page.is_visible("#requeue-form") and not page.is_visible("#cancel-form")
    assert page.errors == []


def test_live_times_read_on_the_servers_clock(live_portal, page, alice, node):
    """Trial 20: the page's times were "2026-12-04 13:29 UTC" as rendered, then "12/4/2026, 1:29:31 PM"
    (the browser's locale) once a live update rewrote them, beside reasons saying "expected 13:29 UTC"."""
    from django.utils import timezone

    _, web = live_portal
    job = submit(alice, task_name="clock")
    sign_in(page, web.url, "alice", "pw-alice")
    page.goto(f"{web.url}/jobs/{job.pk}/")
    started = timezone.now()
    job_transition(job.pk, expected=[JobState.QUEUED], to=JobState.RUNNING, node=node, gpu_indices=[0],
                   started_at=started)
    page.wait_for_function("document.querySelector('[data-field=started_at]').textContent !== '–'", timeout=15000)
    assert page.inner_text("[data-field=started_at]") == f"{started:%Y-%m-%d %H:%M} UTC"
    assert page.errors == []
