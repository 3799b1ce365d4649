"""The /ws/jobs/<id>/ socket while Redis (the channel layer) is away: the stored history, then a
clean close 1013 ("try again later", the page says live updates are paused and reconnects), one
WARNING per process however many sockets meet the outage, and one INFO line when a later socket
joins its group again. Before, each socket's ``group_add`` (or its receive loop) raised a Redis
ConnectionError out of the consumer: a traceback per socket per reconnect of every open page."""

from __future__ import annotations

import logging

import pytest
from asgiref.sync import async_to_sync, sync_to_async

from apps.jobs.services import log_append, metrics_record

from .helpers import submit
from .test_consumers import receive_until_history_end, socket_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]
SOCKETS = 3
LIVE_PAUSED = 1013  # what the page reads as "live updates paused, retrying" (static/portal/job.js)
DOWN, BACK = "Redis unreachable at", "Redis reachable again at"


def outage_lines(caplog) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records
            if r.levelno >= logging.WARNING or r.name == "yoloportal.redis"]


async def history_then_close(communicator) -> tuple[list[dict], dict]:
    connected, _ = await communicator.connect()
    assert connected
    messages = await receive_until_history_end(communicator)
    closed = await communicator.receive_output(timeout=5)
    return messages, closed


def test_sockets_during_an_outage_get_history_and_close_1013_then_join_again_when_back(
        own_redis, alice, demo_registered, caplog):
    job = submit(alice)
    metrics_record(job, epoch=1, values={"train/box_loss": 1.5})
    log_append(job, "epoch 1 done\n")
    own_redis.kill()

    async def during():
        return [await history_then_close(socket_for(alice, job.pk)) for _ in range(SOCKETS)]

    async def after():
        communicator = socket_for(alice, job.pk)
        await communicator.connect()
        history = await receive_until_history_end(communicator)
        await sync_to_async(log_append)(job, "live again\n")
        message = await communicator.receive_json_from(timeout=5)
        await communicator.disconnect()
        return history, message

    with caplog.at_level(logging.INFO):
        sockets = async_to_sync(during)()
        alarms = outage_lines(caplog)
        own_redis.start()
        history, message = async_to_sync(after)()
    for messages, closed in sockets:
        assert [m["seq"] for m in messages] == [1, 2, 3, 3], "the stored history and the snapshot"
        assert messages[-1]["history_end"] and messages[-1]["data"]["state"] == "queued"
        assert closed == {"type": "websocket.close", "code": LIVE_PAUSED}
    assert [(level, text[:len(DOWN)]) for level, text in alarms] == [("WARNING", DOWN)], alarms
    assert "live page updates pause" in alarms[0][1]
    assert [m["seq"] for m in history] == [1, 2, 3, 3]
    assert message["type"] == "log" and message["data"]["text"] == "live again\n" and message["seq"] == 4
    logged = outage_lines(caplog)
    assert [level for level, _ in logged] == ["WARNING", "INFO"], logged
    assert logged[1][1].startswith(BACK), logged


def test_an_open_socket_whose_receive_loop_loses_redis_closes_1013_with_one_warning(
        own_redis, alice, demo_registered, caplog):
    job = submit(alice)

    async def run():
        sockets = [socket_for(alice, job.pk) for _ in range(SOCKETS)]
        for communicator in sockets:
            await communicator.connect()
            await receive_until_history_end(communicator)
        own_redis.kill()
        return [await communicator.receive_output(timeout=10) for communicator in sockets]

    with caplog.at_level(logging.INFO):
        closes = async_to_sync(run)()
    assert closes == [{"type": "websocket.close", "code": LIVE_PAUSED}] * SOCKETS
    alarms = outage_lines(caplog)
    assert [(level, text[:len(DOWN)]) for level, text in alarms] == [("WARNING", DOWN)], alarms
