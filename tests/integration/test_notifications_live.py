"""The notification worker as it runs in production: its own process, RQ's scheduler doing the
backoff between retries, a real HTTP receiver and a real SMTP server."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.jobs.models import JobState
from apps.jobs.services import job_event, job_transition
from apps.notifications.models import Delivery
from apps.notifications.services import channel_create
from apps.notifications.signing import verify
from tests.jobs.factories import make_job
from tests.notifications.receivers import MailServer, WebhookReceiver

from .live import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_the_notify_worker_retries_with_backoff_and_mails(live, teams, bob, node, settings):
    settings.NOTIFY_ALLOW_PRIVATE_TARGETS = True  # channel_create here; the worker gets it by env
    receiver, mail = WebhookReceiver(statuses=[502]).start(), MailServer().start()
    try:
        live.start("notify", "notify_worker", NOTIFY_RETRY_INTERVALS="2,2", NOTIFY_SMTP_PORT=str(mail.port),
                   NOTIFY_SMTP_HOST="127.0.0.1", NOTIFY_FROM="portal@example.org",
                   NOTIFY_ALLOW_PRIVATE_TARGETS="true")
        hook = channel_create(by=bob, name="hook", kind="webhook", target=receiver.url)
        channel_create(by=bob, name="mail", kind="email", target="bob@example.org")
        job = make_job(team=teams["vision"], user=bob, state="running", node=node, task_name="live-notify",
                       queued_at=timezone.now() - timedelta(minutes=1), started_at=timezone.now())
        assert job_transition(job.pk, expected=[JobState.RUNNING], to=JobState.FAILED, error="boom")
        job.refresh_from_db()
        job_event(job, "failed", "boom")  # autocommit: the hook enqueues at once

        wait_for(lambda: Delivery.objects.filter(state="sent").count() == 2, timeout=60,
                 what="both deliveries to be sent")
        first, second = receiver.received
        assert first.body == second.body
        # Measured where they arrived: the signed timestamps are whole seconds, so two posts a
        # millisecond apart across a second's boundary differ by 1 there. RQ schedules the retry
        # at a whole second too (its registry's score), so a 2 s backoff is > 1 s in real time.
        gap = second.at - first.at
        assert gap >= 1.0, f"the retry came {gap:.3f} s after the failure: no backoff"
        assert verify(hook.secret, timestamp=second.headers["x-yoloportal-timestamp"], body=second.body,
                      signature=second.headers["x-yoloportal-signature"])
        assert json.loads(second.body)["event"] == "failed"
        assert Delivery.objects.get(channel=hook).attempts == 2
        [message] = mail.messages
        assert message.rcpt_tos == ["bob@example.org"] and b"live-notify failed" in message.content
    finally:
        receiver.stop()
        mail.stop()
