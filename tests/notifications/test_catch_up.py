"""Notifications Redis lost are made up for: a job event committed while Redis was down
queued no fan-out, and the scheduler's chores catch it up once Redis is back, once."""

from __future__ import annotations

import json
from contextlib import contextmanager
from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.test import override_settings
from django.utils import timezone
from rq import Queue

from apps.jobs.models import JobState
from apps.jobs.services import job_event, job_transition
from apps.notifications.hooks import QUEUE
from apps.notifications.models import Delivery
from apps.notifications.services import channel_create
from apps.notifications.tasks import catch_up, delivery_claim
from apps.scheduling.management.commands.scheduler import Chores
from tests.jobs.factories import make_job

from .helpers import run_notifications

pytestmark = [pytest.mark.django_db]


@contextmanager
def redis_down():
    """Every Redis call of the code under test fails as if the server were gone."""
    from apps.core import redis_client as core_redis

    with override_settings(REDIS_URL="redis://127.0.0.1:1/0"):
        saved, core_redis._client = core_redis._client, None
        try:
            yield
        finally:
            core_redis._client = saved


@pytest.fixture
def running_job(teams, bob, node):
    now = timezone.now()
    return make_job(team=teams["vision"], user=bob, state="running", node=node, gpu_indices=[0],
                    task_name="pcb-detector", queued_at=now - timedelta(minutes=2), started_at=now)


def succeed_while_redis_is_down(job, django_capture_on_commit_callbacks) -> None:
    with redis_down(), django_capture_on_commit_callbacks(execute=True):
        assert job_transition(job.pk, expected=[JobState.RUNNING], to=JobState.SUCCEEDED)
        job.refresh_from_db()
        job_event(job, "succeeded", "succeeded for the test")  # its fan-out is dropped, not raised


def test_an_event_committed_while_redis_was_down_is_notified_once_it_is_back(
        running_job, bob, receiver, django_capture_on_commit_callbacks):
    channel_create(by=bob, name="hook", kind="webhook", target=receiver.url)
    succeed_while_redis_is_down(running_job, django_capture_on_commit_callbacks)
    run_notifications()
    assert not Delivery.objects.exists() and receiver.received == []  # lost, as before this fix

    window = (timezone.now() - timedelta(minutes=5), timezone.now() + timedelta(seconds=1))
    assert catch_up(*window) == {"events": 1, "deliveries_created": 1, "deliveries_requeued": 0}
    run_notifications()
    [post] = receiver.received
    payload = json.loads(post.body)
    assert payload["event"] == "succeeded" and payload["job"]["id"] == str(running_job.pk)
    assert Delivery.objects.get().state == Delivery.State.SENT

    # The same window again (a second scheduler, a restart): nothing is sent twice.
    assert catch_up(*window)["deliveries_created"] == 0
    run_notifications()
    assert len(receiver.received) == 1


def test_a_delivery_that_could_not_be_queued_is_queued_by_the_catch_up(
        running_job, bob, receiver, django_capture_on_commit_callbacks):
    channel_create(by=bob, name="hook", kind="webhook", target=receiver.url)
    with django_capture_on_commit_callbacks(execute=True):
        job_transition(running_job.pk, expected=[JobState.RUNNING], to=JobState.FAILED)
        running_job.refresh_from_db()
        job_event(running_job, "failed", "failed for the test")
    queued = Queue(QUEUE, connection=redis.Redis.from_url(settings.REDIS_URL))
    [fan_out] = queued.jobs
    with redis_down():  # the fan-out runs, but Redis is gone before its delivery is queued
        fan_out.func(*fan_out.args)
    queued.remove(fan_out)
    delivery = Delivery.objects.get()
    assert (delivery.state, delivery.attempts) == ("pending", 0)

    assert catch_up(timezone.now() - timedelta(minutes=5), timezone.now() + timedelta(seconds=1)) == {
        "events": 1, "deliveries_created": 0, "deliveries_requeued": 1}
    run_notifications()
    assert len(receiver.received) == 1 and Delivery.objects.get().state == Delivery.State.SENT


def test_a_delivery_is_sent_by_one_run_only_when_two_hold_it(running_job, bob, receiver):
    channel = channel_create(by=bob, name="hook", kind="webhook", target=receiver.url)
    delivery = Delivery.objects.create(channel=channel, event="succeeded", job=running_job, cause="event:1",
                                       payload={"event": "succeeded"})
    first, second = Delivery.objects.get(pk=delivery.pk), Delivery.objects.get(pk=delivery.pk)
    assert delivery_claim(first) and first.attempts == 1
    assert not delivery_claim(second)  # read before the first claimed: it must not send too


def test_the_chores_keep_the_window_while_redis_is_down_and_move_it_on_after(
        running_job, bob, receiver, django_capture_on_commit_callbacks):
    channel_create(by=bob, name="hook", kind="webhook", target=receiver.url)
    succeed_while_redis_is_down(running_job, django_capture_on_commit_callbacks)
    chores = Chores()
    later = timezone.now() + timedelta(minutes=10)  # past the catch-up's lag
    with redis_down(), pytest.raises(redis.RedisError):
        chores.notifications(now=later)
    assert chores.notified_until is None and not Delivery.objects.exists()

    chores.notifications(now=later)
    assert chores.notified_until is not None
    run_notifications()
    assert len(receiver.received) == 1
    chores.notifications(now=later + timedelta(minutes=1))  # the next window starts where this one ended
    run_notifications()
    assert len(receiver.received) == 1




def preempt(job, django_capture_on_commit_callbacks) -> None:
    """A preemption recorded with Redis up: its own fan-out is queued, and run below."""
    with django_capture_on_commit_callbacks(execute=True):
        job_event(job, "preempted", "preempted for the test")
    run_notifications()


def test_a_channel_created_after_an_event_is_not_sent_it_by_the_catch_up(
        running_job, alice, teams, receiver, django_capture_on_commit_callbacks, caplog):
    """Trial 14, F21/F21b: a team channel made after a preemption got that preemption from the
    next catch-up, which the scheduler logged as "Redis had lost them" with Redis up throughout."""
    preempt(running_job, django_capture_on_commit_callbacks)
    channel_create(by=alice, name="vis-hook", kind="webhook", target=receiver.url, team=teams["vision"],
                   events=["preempted", "succeeded"])

    chores = Chores()  # just restarted: its first window reaches an hour back
    with caplog.at_level("INFO", logger="yoloportal.scheduler"):
        chores.notifications(now=timezone.now() + timedelta(minutes=10))
    run_notifications()
    assert not Delivery.objects.exists() and receiver.received == []
    assert not [r for r in caplog.records if "caught up" in r.getMessage()]

    preempt(running_job, django_capture_on_commit_callbacks)  # after its creation: it hears this one
    [post] = receiver.received
    assert json.loads(post.body)["event"] == "preempted"
