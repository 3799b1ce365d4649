"""The relay's API: a token scoped to one attempt that expires with it; events recorded as from
a local worker; the answer says whether to stop."""

from __future__ import annotations

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from apps.jobs.models import ExecutorAttempt, Job, JobState
from apps.jobs.services import (
    attempt_preempt,
    attempt_start,
    attempt_token_issue,
    job_cancel,
    job_claim,
    job_requeue,
)

from .factories import make_job

pytestmark = pytest.mark.django_db


@pytest.fixture
def running(alice, teams, node):
    job = make_job(team=teams["vision"], user=alice)
    assert job_claim(job, node=node, gpu_indices=[0], gpu_share=1.0, run_class="medium")
    job = attempt_start(job_id=job.pk, attempt_id=job.attempt_id, node_name="node-a")
    ExecutorAttempt.objects.create(job=job, attempt=job.attempt, attempt_id=job.attempt_id, external_id="42")
    return job


def report(job, token, body=None, attempt_id=None):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Attempt {token}")
    return client.post(f"/api/v1/attempts/{attempt_id or job.attempt_id}/report/", body or {}, format="json")


def test_the_relay_reports_events_and_output_and_hears_go_on(running):
    token = attempt_token_issue(running)
    response = report(running, token, {"events": [{"type": "epoch", "epoch": 1, "values": {"fitness": 0.1}}],
                                       "log": "Ultralytics 8.4\n"})
    assert response.status_code == 200 and response.json() == {"stop": ""}
    job = Job.objects.get(pk=running.pk)
    assert job.epochs_done == 1 and "Ultralytics" in job.log_chunks.get().text


def test_the_final_report_is_kept_for_the_agent(running):
    final = {"exit_code": 0, "outcome": "succeeded", "finished": {"weights": "w"}}
    assert report(running, attempt_token_issue(running), {"final": final}).status_code == 200
    assert ExecutorAttempt.objects.get(attempt_id=running.attempt_id).report == final


def test_a_cancel_in_the_portal_is_the_answer(running, alice):
    job_cancel(job=running, by=alice)
    assert report(running, attempt_token_issue(running)).json() == {"stop": "cancelled"}


def test_the_token_expires_with_its_attempt(running):
    token, old_attempt = attempt_token_issue(running), running.attempt_id
    job_requeue(running, reason="node lost")
    response = report(running, token, {"events": [{"type": "epoch", "epoch": 1, "values": {}}]},
                      attempt_id=old_attempt)
    assert response.json() == {"stop": "fenced"}
    assert Job.objects.get(pk=running.pk).epochs_done == 0  # nothing of a stale attempt is recorded


def test_a_preempted_attempt_hears_preempted_and_its_epoch_end_is_recorded(running):
    """Graceful preemption (worker/executors/relay.py stops the child at its epoch end): the
    victim's rows are the fence's to refuse (attempt_may_record), not refused for being stale."""
    token, old_attempt = attempt_token_issue(running), running.attempt_id
    attempt_preempt(running, reason="a higher-priority job", now=timezone.now(), grace_s=60)
    response = report(running, token, {"events": [{"type": "epoch", "epoch": 1, "values": {}},
                                                  {"type": "stopped", "epoch": 1, "reason": "stop_file"}],
                                       "log": "epoch 1 done\n"}, attempt_id=old_attempt)
    assert response.json() == {"stop": "preempted"}
    job = Job.objects.get(pk=running.pk)
    assert (job.state, job.epochs_done) == (JobState.QUEUED, 1)
    assert job.events.get(kind="stopped_at_epoch_end").attempt == 1

    # Said once however often it is posted (the report is the compute node's word).
    stop = {"type": "stopped", "epoch": 1, "reason": "stop_file"}
    report(running, token, {"events": [stop, {"type": "stopping"}, stop, {"type": "stopping"}]}, attempt_id=old_attempt)
    assert [job.events.filter(kind=kind).count() for kind in ("stopped_at_epoch_end", "stopping")] == [1, 1]


def test_a_victim_preempted_while_its_report_is_recorded_hears_preempted_not_fenced(running):
    """The report read the job while its attempt was current and checked in after the preemption
    committed: the check-in's "fenced" made the relay kill the training mid-epoch (seen as exit -15
    under load in test_slurm_preemption), where any later report hears "preempted"."""
    from apps.jobs.services import attempt_report

    read_before = Job.objects.select_related("node", "team", "user").get(pk=running.pk)
    attempt_preempt(Job.objects.get(pk=running.pk), reason="a higher-priority job", now=timezone.now(), grace_s=60)
    assert attempt_report(read_before, attempt_id=running.attempt_id, events=[], log="", final=None) == "preempted"


def test_the_token_expires_after_the_timeout_in_any_case(running, settings, monkeypatch):
    import time as time_module

    token = attempt_token_issue(running)
    later = time_module.time() + running.timeout_s + settings.ATTEMPT_TOKEN_SLACK_S + 5
    monkeypatch.setattr("django.core.signing.time.time", lambda: later)
    response = report(running, token)
    assert response.status_code == 403 and response.json()["token"] == ["has expired"]


def test_a_token_is_for_its_attempt_only(running, alice, teams, node):
    other = make_job(team=teams["vision"], user=alice, state=JobState.RUNNING, node=node)
    token = attempt_token_issue(other)
    response = report(running, token)
    assert response.status_code == 403 and response.json()["token"] == ["was issued for another attempt"]


@pytest.mark.parametrize("header", ["", "Token abc", "Attempt ", "Attempt forged:token:value"])
def test_anything_but_the_attempts_own_token_is_refused(running, header):
    client = APIClient()
    if header:
        client.credentials(HTTP_AUTHORIZATION=header)
    response = client.post(f"/api/v1/attempts/{running.attempt_id}/report/", {}, format="json")
    assert response.status_code == 403 and "token" in response.json()


def test_a_bad_body_names_the_field(running):
    response = report(running, attempt_token_issue(running), {"events": "not a list", "log": 5})
    assert response.status_code == 400 and "events" in response.json()
