"""A sweep is heard as one message carrying its result, not one message per trial (trial 16, G18)."""

from __future__ import annotations

import json

import pytest

from apps.notifications.services import channel_create, preference_update
from apps.sweeps.services import sweeps_advance
from tests.sweeps.conftest import METRIC, submit_sweep, train, trial_jobs

from .helpers import run_notifications

pytestmark = pytest.mark.django_db


@pytest.fixture
def sweeper(alice, demo_registered, node, clean_storage):
    """As tests/sweeps: alice of team vision, the demo dataset registered, a node with simulated GPUs."""
    return alice


def run_sweep(owner, node, capture, finals=(0.30, 0.55)):
    with capture(execute=True):
        parent = submit_sweep(owner, parameters={"lr0": [0.01, 0.001]}, method="grid", parallel=2)
        sweeps_advance()
        for job, final in zip(trial_jobs(parent), finals, strict=True):
            train(job, node, [final / 2, final])
        sweeps_advance()
    run_notifications()
    return parent


def test_a_sweep_sends_one_message_with_its_trials_best_and_registered_version(
        sweeper, node, receiver, django_capture_on_commit_callbacks):
    channel_create(by=sweeper, name="mine", kind="webhook", target=receiver.url)
    channel_create(by=sweeper, name="team", kind="webhook", target=receiver.url, team=sweeper.memberships.first().team,
                   events=["succeeded", "failed"])
    parent = run_sweep(sweeper, node, django_capture_on_commit_callbacks)
    payloads = [json.loads(post.body) for post in receiver.received]
    assert [p["job"]["id"] for p in payloads] == [str(parent.pk)] * 2  # the personal and the team channel
    payload = payloads[0]
    best = trial_jobs(parent)[1]
    assert payload["sweep"] == {"trials": 2, "completed": 2, "pruned": 0, "failed": 0, "model": "lr-sweep:v1",
                                "best": {"trial": 1, "job": str(best.pk), "value": 0.55, "params": {"lr0": 0.001},
                                         "tied": [1]}}
    assert payload["message"].startswith("lr-sweep succeeded: finished (2 completed, 0 pruned, 0 failed of 2); "
                                         f"best: trial 1, {METRIC} 0.55")
    assert "registered as vision/lr-sweep:v1" in payload["message"]


def test_an_owner_who_asks_for_each_trial_hears_them_too(sweeper, node, receiver, django_capture_on_commit_callbacks):
    channel_create(by=sweeper, name="mine", kind="webhook", target=receiver.url)
    preference_update(user=sweeper, on_sweep_trials=True)
    parent = run_sweep(sweeper, node, django_capture_on_commit_callbacks)
    ids = sorted(json.loads(post.body)["job"]["id"] for post in receiver.received)
    assert ids == sorted([str(parent.pk), *(str(job.pk) for job in trial_jobs(parent))])
