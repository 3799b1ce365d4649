"""A job's live messages go to its WebSocket group once their transaction commits (jobs.live).

Many events are written in the transaction of their state change (a start, a requeue, a final
state); a channel-layer send inside it waited on Redis while holding SQLite's write lock,
every other writer with it, for as long as a hung Redis took to time out. Sent after the
commit, the order within a transaction is kept and a rolled-back event is never announced.
Real Redis (the session's redis-server), a real channel-layer listener.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
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


@pytest.fixture
def hung_redis(redis_server):
    """A server that accepts connections and never answers (a hung Redis, not a refusing one);
    the channel layer points at it for the test, then back at the session's Redis."""
    import socket
    import threading

    from channels.layers import channel_layers
    from django.conf import settings

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    accepted = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                accepted.append(server.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    host = settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"][0]
    host["address"] = f"redis://127.0.0.1:{server.getsockname()[1]}/0"
    channel_layers.backends.clear()
    yield
    host["address"] = redis_server.url
    channel_layers.backends.clear()
    server.close()
    for connection in accepted:
        connection.close()


def test_a_hung_redis_holds_a_publisher_at_most_the_publish_timeout(job, hung_redis):
    """The channel layer's own read timeout is 30 s (its consumers block in BZPOPMIN): a scheduler
    or worker publishing an event waited that long per message."""
    from apps.core import channel_send
    from apps.jobs import live

    started = time.monotonic()
    assert live.publish(job.pk, {"type": "status", "seq": 1, "job": str(job.pk), "data": {}}) is False
    assert time.monotonic() - started < channel_send.SEND_TIMEOUT_S + 3



def test_a_hung_redis_holds_a_member_removal_at_most_the_send_timeout(alice, hung_redis):
    """The request removing a member tells their open sockets: it waited 30 s on a hung Redis (chaos22)."""
    from apps.accounts.live import access_changed
    from apps.core import channel_send

    started = time.monotonic()
    assert access_changed(alice.pk) is False
    assert time.monotonic() - started < channel_send.SEND_TIMEOUT_S + 3
