"""A live socket's receive now waits for ``joined`` (28d6706). A group message sent right
after the groups are joined (before ``joined`` is set is impossible: it is set on the same step), and
one sent while the history is read, both reach the page after the snapshot."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from apps.jobs import live
from apps.portal import consumers

from .helpers import submit
from .test_consumers import receive_until_history_end, socket_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def test_messages_sent_while_joining_and_during_history_are_delivered(alice, demo_registered, monkeypatch):
    job = submit(alice)
    group = live.group_name(job.pk)
    layer = get_channel_layer()

    def message(seq):
        return {"type": "job.message", "message": {"type": "log", "seq": seq, "job": str(job.pk),
                                                     "data": {"text": f"{seq}\n"}}}

    real_reachable, real_history = consumers.redis_reachable, consumers.load_history

    def reachable():  # runs between group_add and joined.set()
        asyncio.get_running_loop().create_task(layer.group_send(group, message(900)))
        return real_reachable()

    async def history(user, job_id):
        await layer.group_send(group, message(901))
        return await real_history(user, job_id)

    monkeypatch.setattr(consumers, "redis_reachable", reachable)
    monkeypatch.setattr(consumers, "load_history", history)

    async def watch():
        communicator = socket_for(alice, job.pk)
        await communicator.connect()
        await receive_until_history_end(communicator)
        got = [await communicator.receive_json_from(timeout=5) for _ in range(2)]
        await communicator.disconnect()
        return got

    assert sorted(m["seq"] for m in async_to_sync(watch)()) == [900, 901]
