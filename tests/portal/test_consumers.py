"""The /ws/jobs/<id>/ socket: history first, then live; every message numbered; outsiders refused."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.test import Client

from apps.jobs import live
from apps.jobs.services import job_event, log_append, metrics_record
from apps.portal.routing import websocket_urlpatterns
from yoloportal.asgi import application

from .helpers import submit

# Each socket test takes seconds: a hang should fail in two minutes, not in the suite-wide ten.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def socket_for(user, job_id) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), f"/ws/jobs/{job_id}/")
    communicator.scope["user"] = user
    return communicator


async def receive_until_history_end(communicator) -> list[dict]:
    messages = []
    while True:
        message = await communicator.receive_json_from(timeout=5)
        messages.append(message)
        if message.get("history_end"):
            return messages


def test_it_sends_the_stored_history_in_seq_order_then_a_snapshot(alice, demo_registered):
    job = submit(alice)
    metrics_record(job, epoch=1, values={"train/box_loss": 1.5})
    log_append(job, "epoch 1 done\n")
    metrics_record(job, epoch=2, values={"train/box_loss": 1.2})

    async def run():
        communicator = socket_for(alice, job.pk)
        connected, _ = await communicator.connect()
        assert connected
        messages = await receive_until_history_end(communicator)
        await communicator.disconnect()
        return messages

    messages = async_to_sync(run)()
    history, snapshot = messages[:-1], messages[-1]
    assert [m["type"] for m in history] == ["status", "metrics", "log", "metrics"]
    assert [m["seq"] for m in history] == [1, 2, 3, 4]
    assert history[0]["data"]["kind"] == "submitted"
    assert [m["data"]["epoch"] for m in history if m["type"] == "metrics"] == [1, 2]
    assert snapshot["seq"] == 4 and snapshot["data"]["state"] == "queued"


def test_it_streams_live_messages_after_history_with_the_next_seq(alice, demo_registered):
    job = submit(alice)

    async def run():
        communicator = socket_for(alice, job.pk)
        await communicator.connect()
        history = await receive_until_history_end(communicator)
        await sync_to_async(metrics_record)(job, epoch=1, values={"train/box_loss": 1.0})
        await sync_to_async(log_append)(job, "hello\n")
        live_messages = [await communicator.receive_json_from(timeout=5) for _ in range(2)]
        await communicator.disconnect()
        return history, live_messages

    history, live_messages = async_to_sync(run)()
    last_history_seq = history[-1]["seq"]
    assert [m["seq"] for m in live_messages] == [last_history_seq + 1, last_history_seq + 2]
    assert [m["type"] for m in live_messages] == ["metrics", "log"]
    assert live_messages[0]["data"] == {"epoch": 1, "attempt": 1, "values": {"train/box_loss": 1.0}}


def test_it_passes_progress_messages_which_have_no_seq(alice, demo_registered):
    job = submit(alice)

    async def run():
        communicator = socket_for(alice, job.pk)
        await communicator.connect()
        await receive_until_history_end(communicator)
        await sync_to_async(live.publish)(job.pk, {"type": "progress", "seq": None, "job": str(job.pk),
                                                   "data": {"epoch": 1, "batch": 3, "batches": 10}})
        message = await communicator.receive_json_from(timeout=5)
        await communicator.disconnect()
        return message

    assert async_to_sync(run)()["data"]["batch"] == 3


def test_it_does_not_repeat_a_message_already_sent_as_history(alice, demo_registered):
    """A live copy of a history message (joined the group before reading) is dropped."""
    job = submit(alice)
    point = metrics_record(job, epoch=1, values={"x": 1})

    async def run():
        communicator = socket_for(alice, job.pk)
        await communicator.connect()
        await receive_until_history_end(communicator)
        duplicate = {"type": "metrics", "seq": point.seq, "job": str(job.pk), "data": {"epoch": 1, "values": {}}}
        await sync_to_async(live.publish)(job.pk, duplicate)
        await sync_to_async(job_event)(job, "note", "after history")
        message = await communicator.receive_json_from(timeout=5)
        await communicator.disconnect()
        return message

    message = async_to_sync(run)()
    assert message["type"] == "status" and message["data"]["kind"] == "note"


def test_it_delivers_a_number_below_the_history_end_that_history_did_not_contain(alice, demo_registered):
    """A number allocated before history was read but written after it is delivered live."""
    from apps.jobs.services import seq_allocate

    job = submit(alice)
    raced = seq_allocate(job.pk)  # a writer took this number and has not written its row yet
    metrics_record(job, epoch=1, values={"x": 1})

    async def run():
        communicator = socket_for(alice, job.pk)
        await communicator.connect()
        history = await receive_until_history_end(communicator)
        await sync_to_async(live.publish)(job.pk, {"type": "log", "seq": raced, "job": str(job.pk),
                                                   "data": {"text": "raced"}})
        message = await communicator.receive_json_from(timeout=5)
        await communicator.disconnect()
        return history, message

    history, message = async_to_sync(run)()
    assert raced < history[-1]["seq"] and raced not in [m["seq"] for m in history[:-1]]
    assert message["seq"] == raced and message["data"]["text"] == "raced"


def test_it_refuses_another_teams_job(alice, carol, demo_registered):
    job = submit(alice)

    assert async_to_sync(refusal)(socket_for(carol, job.pk)) == {"type": "websocket.close", "code": 4404}


async def refusal(communicator) -> dict:
    """What a refused socket gets: accepted (a close before the accept would be an HTTP 403 at
    the handshake, which hides the code from real clients), then closed with the code and
    nothing sent."""
    connected, _ = await communicator.connect()
    assert connected
    message = await communicator.receive_output()
    # The client goes, as a real one does after a close: the consumer then ends. Left running,
    # its channel-layer receive was cancelled when the test's loop closed, which hung once in
    # CI for the whole 600 s (a close before the accept left it running just the same).
    await communicator.disconnect()
    return message


def test_it_refuses_an_anonymous_socket(alice, demo_registered):
    from django.contrib.auth.models import AnonymousUser

    job = submit(alice)
    assert async_to_sync(refusal)(socket_for(AnonymousUser(), job.pk)) == {"type": "websocket.close", "code": 4401}


def test_a_refused_socket_never_starts_a_channel_layer_receive(alice, bob, carol, demo_registered, monkeypatch):
    """Trial25: a refused socket's receive (often its web process's first use of the layer's Redis
    connection) was not cancelled when the socket ended: its consumer hung for the life of the
    process, which then could not stop gracefully. Nothing is received before joining now."""
    from channels.layers import get_channel_layer
    from django.contrib.auth.models import AnonymousUser

    layer = type(get_channel_layer())
    original, started = layer.receive, []

    async def receive(self, channel):
        started.append(channel)
        return await original(self, channel)

    monkeypatch.setattr(layer, "receive", receive)
    job = submit(alice)
    assert async_to_sync(refusal)(socket_for(carol, job.pk))["code"] == 4404
    assert async_to_sync(refusal)(socket_for(AnonymousUser(), job.pk))["code"] == 4401
    nowhere = WebsocketCommunicator(URLRouter(websocket_urlpatterns), "/ws/jobs/not-a-uuid/")
    nowhere.scope["user"] = alice
    assert async_to_sync(refusal)(nowhere)["code"] == 4404
    assert started == []

    async def watch():
        communicator = socket_for(bob, job.pk)
        await communicator.connect()
        await receive_until_history_end(communicator)
        await sync_to_async(log_append)(job, "live\n")
        message = await communicator.receive_json_from(timeout=5)
        await communicator.disconnect()
        return message

    assert async_to_sync(watch)()["data"] == {"text": "live\n"}
    assert len(started) >= 1  # an accepted socket receives, once joined


@pytest.mark.parametrize("frame", [{"text_data": "not json"}, {"bytes_data": b"\x00\xff"}, {"text_data": "[1, 2"}],
                         ids=["text-not-json", "binary", "text-cut-short"])
def test_a_frame_from_the_client_is_ignored_and_the_socket_goes_on(frame, alice, demo_registered):
    """The socket is one-way: what a client sends is dropped. A frame that was not JSON (or a binary
    one) raised in the consumer: a traceback in the web log, the connection cut without a close, and
    its client left counted in yoloportal_websocket_clients (trial28 F2)."""
    job = submit(alice)

    async def run():
        communicator = socket_for(alice, job.pk)
        await communicator.connect()
        history = await receive_until_history_end(communicator)
        await communicator.send_to(**frame)
        await sync_to_async(log_append)(job, "still here\n")
        message = await communicator.receive_json_from(timeout=5)
        await communicator.disconnect()
        return history, message

    history, message = async_to_sync(run)()
    assert message["type"] == "log" and message["seq"] == history[-1]["seq"] + 1
    assert message["data"]["text"] == "still here\n"


def test_it_lets_a_teammate_watch(alice, bob, demo_registered):
    job = submit(alice)

    async def run():
        communicator = socket_for(bob, job.pk)
        connected, _ = await communicator.connect()
        await communicator.disconnect()
        return connected

    assert async_to_sync(run)()


def session_headers(user, origin: str) -> list[tuple[bytes, bytes]]:
    client = Client()
    client.force_login(user)
    cookie = f"sessionid={client.cookies['sessionid'].value}"
    return [(b"cookie", cookie.encode()), (b"origin", origin.encode()), (b"host", b"testserver")]


def test_the_full_stack_authenticates_the_session_cookie(alice, demo_registered):
    job = submit(alice)
    headers = session_headers(alice, "http://testserver")

    async def run():
        communicator = WebsocketCommunicator(application, f"/ws/jobs/{job.pk}/", headers=headers)
        connected, _ = await communicator.connect()
        await communicator.disconnect()
        return connected

    assert async_to_sync(run)()


def test_the_full_stack_refuses_a_foreign_origin(alice, demo_registered):
    job = submit(alice)
    headers = session_headers(alice, "http://evil.example")

    async def run():
        communicator = WebsocketCommunicator(application, f"/ws/jobs/{job.pk}/", headers=headers)
        connected, _ = await communicator.connect()
        # The refusing consumer still waits for websocket.disconnect (a real server sends it
        # after the close). Left running, it is cancelled at the event loop's shutdown beside
        # channels-redis's own receive tasks, which once hung that shutdown for the whole
        # 600 s test timeout on PostgreSQL CI.
        await communicator.disconnect()
        return connected

    assert not async_to_sync(run)()


def test_a_live_placement_of_an_urgent_job_beyond_its_teams_allowance_carries_its_run_class(alice, teams, node):
    """trial31 left: "runs as high: beyond the team's urgent allowance" appeared on the job page only after a
    reload: the live status message carried the state alone. The real scheduler pass places the job as high
    (the team's urgent GPU-hours are below its timeout); the message and the snapshot carry both classes."""
    from apps.quotas.models import TeamQuota
    from apps.scheduling.loop import plan_and_start
    from tests.jobs.factories import make_job

    TeamQuota.objects.update_or_create(team=teams["vision"], defaults={"urgent_gpu_hours_per_day": 0.0001})
    job = make_job(team=teams["vision"], user=alice, priority_class="urgent")

    async def run():
        communicator = socket_for(alice, job.pk)
        await communicator.connect()
        await receive_until_history_end(communicator)
        assert await sync_to_async(plan_and_start)()
        placed = await communicator.receive_json_from(timeout=5)
        await communicator.disconnect()
        again = socket_for(alice, job.pk)
        await again.connect()
        snapshot = (await receive_until_history_end(again))[-1]
        await again.disconnect()
        return placed, snapshot

    placed, snapshot = async_to_sync(run)()
    assert placed["data"]["kind"] == "scheduled" and "runs as high" in placed["data"]["message"]
    assert {k: placed["data"][k] for k in ("state", "priority_class", "run_class")} == {
        "state": "starting", "priority_class": "urgent", "run_class": "high"}
    assert {k: snapshot["data"][k] for k in ("state", "priority_class", "run_class")} == {
        "state": "starting", "priority_class": "urgent", "run_class": "high"}
