"""A job's live messages go to its WebSocket group once their transaction commits (jobs.live).

Many events are written in the transaction of their state change (a start, a requeue, a final
state); a channel-layer send inside it waited on Redis while holding SQLite's write lock,
every other writer with it, for as long as a hung Redis took to time out. Sent after the
commit, the order within a transaction is kept and a rolled-back event is never announced.
Real Redis (the session's redis-server), a real channel-layer listener.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from apps.jobs.live import group_name
from apps.jobs.services import job_event, log_append, metrics_record

from .factories import make_job

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


class Listener:
    """A channel in the job's group, as a watching browser's consumer has."""

    def __init__(self, job_id) -> None:
        self.layer = get_channel_layer()
        # A named channel, not new_channel()'s process-local one, whose receive buffer is bound
        # to the event loop of its first receive (each async_to_sync call runs its own).
        self.channel = f"live-listener.{uuid.uuid4().hex}"
        async_to_sync(self.layer.group_add)(group_name(job_id), self.channel)

    def received(self, wait_s: float = 0.5) -> list[dict]:
        async def drain() -> list[dict]:
            messages = []
            while True:
                try:
                    message = await asyncio.wait_for(self.layer.receive(self.channel), wait_s)
                except TimeoutError:
                    return messages
                messages.append(message["message"])

        return async_to_sync(drain)()


@pytest.fixture
def job(alice, teams):
    return make_job(team=teams["vision"], user=alice)


def test_events_written_in_a_transaction_are_published_after_it_commits_in_seq_order(job):
    listener = Listener(job.pk)
    with transaction.atomic():
        first = job_event(job, "note", "first")
        second = job_event(job, "note", "second")
        assert listener.received() == []  # still inside: nothing announced yet
    messages = listener.received()
    assert [(m["seq"], m["data"]["message"]) for m in messages] == [(first.seq, "first"), (second.seq, "second")]


def test_a_rolled_back_event_is_never_published(job):
    listener = Listener(job.pk)
    with transaction.atomic():
        job_event(job, "note", "undone")
        transaction.set_rollback(True)
    assert listener.received() == []


def test_metrics_and_output_outside_a_transaction_are_published_at_once(job):
    listener = Listener(job.pk)
    point = metrics_record(job, epoch=1, values={"loss": 1.0})
    chunk = log_append(job, "epoch 1 done\n")
    assert [(m["type"], m["seq"]) for m in listener.received()] == [("metrics", point.seq), ("log", chunk.seq)]
