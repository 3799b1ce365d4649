"""Someone taken out of a team hears nothing more of its work (sec22): not their own job left running
there, not through a delivery queued before they left, not through a team channel they made."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.accounts.models import Membership
from apps.accounts.services import membership_remove, membership_remove_preview
from apps.jobs.models import JobState
from apps.jobs.services import job_event, job_transition
from apps.notifications.models import Channel, Delivery
from apps.notifications.services import channel_create
from tests.jobs.factories import make_job

from .helpers import run_notifications

pytestmark = [pytest.mark.django_db]


@pytest.fixture(autouse=True)
def instant_retries(settings):
    settings.NOTIFY_RETRY_INTERVALS = [0, 0, 0]
    settings.NOTIFY_TIMEOUT_S = 5


@pytest.fixture
def running_job(teams, bob, node):
    now = timezone.now()
    return make_job(team=teams["vision"], user=bob, state="running", node=node, gpu_indices=[0],
                    task_name="pcb-detector", queued_at=now - timedelta(minutes=2), started_at=now)


def finish(job, state: str, capture) -> None:
    with capture(execute=True):
        assert job_transition(job.pk, expected=[JobState.RUNNING], to=state)
        job.refresh_from_db()
        job_event(job, state, f"{state} for the test")
    run_notifications()


def remove(user, team, by, capture) -> list[str]:
    with capture(execute=True):
        return membership_remove(membership=Membership.objects.get(user=user, team=team), by=by)


def test_a_removed_member_hears_nothing_of_their_job_left_running_but_the_team_channel_does(
        running_job, alice, bob, teams, receiver, django_capture_on_commit_callbacks):
    channel_create(by=bob, name="mine", kind="webhook", target=receiver.url)
    channel_create(by=alice, name="team", kind="webhook", target=receiver.url, team=teams["vision"],
                   events=["succeeded"])
    remove(bob, teams["vision"], alice, django_capture_on_commit_callbacks)
    finish(running_job, "succeeded", django_capture_on_commit_callbacks)
    assert len(receiver.received) == 1
    assert list(Delivery.objects.values_list("channel__name", "state")) == [("team", Delivery.State.SENT)]


def test_a_delivery_queued_before_the_removal_is_not_sent_after_it(
        running_job, alice, bob, teams, receiver, django_capture_on_commit_callbacks):
    """Retries run for minutes: the send itself checks the membership again."""
    from apps.notifications.tasks import deliver

    channel = channel_create(by=bob, name="mine", kind="webhook", target=receiver.url)
    delivery = Delivery.objects.create(channel=channel, event="failed", job=running_job, cause="event:1",
                                       payload={"event": "failed", "message": "pcb-detector failed"})
    remove(bob, teams["vision"], alice, django_capture_on_commit_callbacks)
    assert deliver(delivery.pk) == Delivery.State.FAILED
    assert receiver.received == []
    delivery.refresh_from_db()
    assert delivery.last_error == "not sent: bob is no longer a member of vision"


def test_a_deactivated_owner_hears_nothing_more(running_job, bob, receiver, django_capture_on_commit_callbacks):
    channel_create(by=bob, name="mine", kind="webhook", target=receiver.url)
    bob.is_active = False
    bob.save(update_fields=["is_active"])
    finish(running_job, "succeeded", django_capture_on_commit_callbacks)
    assert receiver.received == []


def test_the_removal_still_tells_them_it_cancelled_their_queued_job(
        alice, bob, teams, receiver, django_capture_on_commit_callbacks):
    make_job(team=teams["vision"], user=bob, task_name="waiting-one")
    channel_create(by=bob, name="mine", kind="webhook", target=receiver.url)
    remove(bob, teams["vision"], alice, django_capture_on_commit_callbacks)
    run_notifications()
    [post] = receiver.received
    assert json.loads(post.body)["message"] == "waiting-one was cancelled by alice: its owner bob was removed from vision"


def test_team_channels_a_removed_manager_made_are_disabled_and_the_removal_says_so(
        alice, bob, teams, receiver, django_capture_on_commit_callbacks):
    """A team channel sends to the address its creator gave, often their own."""
    Membership.objects.filter(user=bob, team=teams["vision"]).update(role="manager")
    theirs = channel_create(by=bob, name="bob's hook", kind="webhook", target=receiver.url, team=teams["vision"],
                            events=["succeeded"])
    others = channel_create(by=alice, name="alice's hook", kind="webhook", target=receiver.url,
                            team=teams["vision"], events=["succeeded"])
    membership = Membership.objects.get(user=bob, team=teams["vision"])
    assert "team channel bob created will be disabled (bob's hook)" in membership_remove_preview(membership=membership)
    said = remove(bob, teams["vision"], alice, django_capture_on_commit_callbacks)
    assert any("bob's hook" in sentence and "disabled" in sentence for sentence in said)
    assert not Channel.objects.get(pk=theirs.pk).enabled and Channel.objects.get(pk=others.pk).enabled
    job = make_job(team=teams["vision"], user=alice, state="running", started_at=timezone.now())
    finish(job, "succeeded", django_capture_on_commit_callbacks)
    assert len(receiver.received) == 1
    assert list(Delivery.objects.filter(job=job).values_list("channel__name", flat=True)) == ["alice's hook"]
