"""WebSocket ``/ws/jobs/<id>/``: the stored history first, then live messages, all with ``seq``.

Join the group before reading history: Channels dispatches this consumer's messages one
at a time, so group messages that arrive while ``connect`` reads the database wait
until it returns. Those already sent as history are then dropped here (by ``seq``); a
message *below* the last history ``seq`` that history did not contain (its row was
written just after the read, or by a second writer whose number was allocated earlier)
is still delivered. The page dedupes by ``seq`` too and refetches gaps over REST.

While Redis (the channel layer) is away, a socket still gets the stored history and snapshot,
then closes with 1013 ("try again later"): the page says live updates are paused and reconnects
later. A receive loop that loses Redis closes the same way. The outage is logged once per process
through apps/core/redis_outage.py (and "back" on a later join), not as a traceback per socket.
"""

from __future__ import annotations

import asyncio

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer, AsyncWebsocketConsumer
from django.conf import settings
from django.contrib.auth import get_user_model

from apps.accounts.live import access_group
from apps.core.redis_outage import redis_reachable, redis_use_failed
from apps.core.storage import StorageUnavailable
from apps.jobs import live
from apps.jobs.log_archive import log_chunks
from apps.jobs.models import JobEvent, LogChunk, MetricPoint
from apps.jobs.selectors import job_get
from apps.monitoring import recorders

HISTORY_LOG_CHUNKS = 200
LIVE_PAUSED = 1013  # "try again later" (RFC 6455): the page keeps what it has and reconnects


@database_sync_to_async
def load_history(user, job_id):
    job = job_get(user=user, job_id=job_id)
    if job is None:
        return None
    messages = []
    for point in MetricPoint.objects.filter(job=job):
        messages.append({"type": "metrics", "seq": point.seq, "job": str(job.pk),
                         "data": {"epoch": point.epoch, "attempt": point.attempt, "values": point.values}})
    for event in JobEvent.objects.filter(job=job):
        messages.append({"type": "status", "seq": event.seq, "job": str(job.pk),
                         "data": {"state": None, "kind": event.kind, "message": event.message, "attempt": event.attempt,
                                  "time": event.created_at.isoformat()}})
    try:
        chunks = log_chunks(job, newest=HISTORY_LOG_CHUNKS)  # hot or archived (apps/jobs/log_archive.py)
    except StorageUnavailable:
        chunks = [LogChunk(seq=0, text="[this job's logs are archived and the storage cannot be reached right now]\n")]
    for chunk in chunks:
        messages.append({"type": "log", "seq": chunk.seq, "job": str(job.pk), "data": {"text": chunk.text}})
    messages.sort(key=lambda m: m["seq"])
    return job, messages


def still_visible(user_id, job_id) -> bool:
    """Whether the account is still active and may still see the job (memberships change)."""
    user = get_user_model().objects.filter(pk=user_id, is_active=True).first()
    return user is not None and job_get(user=user, job_id=job_id) is not None


class JobConsumer(AsyncJsonWebsocketConsumer):
    """A removed member's socket closes (4404) within ``WS_ACCESS_RECHECK_S`` seconds: at once
    when the membership service announces it (group ``access.<user id>``), and by a periodic
    re-check for changes made any other way (issue 9, finding 10)."""

    closed = False
    live = True  # False once the channel layer (Redis) failed: history only, then close 1013

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Set once the groups are joined: only then does the channel-layer receive start.
        self.joined = asyncio.Event()

    @property
    def channel_receive(self):
        return self._channel_receive

    @channel_receive.setter
    def channel_receive(self, receive):
        """Channels' receive loop (AsyncConsumer.__call__) reads this: a Redis connection error
        there becomes one ``live.lost`` message (close 1013), then the loop waits (cancelled when
        the socket ends) instead of killing the consumer with a traceback."""

        async def tolerant_receive():
            # Nothing can arrive before the groups are joined, and a refused socket (4401, 4404)
            # joins none: its receive never starts. Started at once, as Channels does, a refused
            # socket's receive — often its process's first use of the layer's Redis connection —
            # could not be cancelled when the socket ended: the consumer hung on it for the life
            # of the web process, which then could not stop gracefully (a traceback at Ctrl-C when
            # Redis went; trial25). Waiting on an Event is cancelled cleanly.
            await self.joined.wait()
            if self.live:
                try:
                    return await receive()
                except Exception as exc:
                    if not redis_use_failed(exc):
                        raise
                    self.live = False
                    return {"type": "live.lost"}
            await asyncio.Event().wait()

        self._channel_receive = tolerant_receive

    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.refuse(4401)
            return
        job_id = self.scope["url_route"]["kwargs"]["job_id"]
        # Refuse before joining anything: another team's job looks exactly like a missing one.
        if await database_sync_to_async(job_get)(user=user, job_id=job_id) is None:
            await self.refuse(4404)
            return
        self.group = live.group_name(job_id)
        self.user_id, self.job_id = user.pk, job_id
        self.access_group = access_group(user.pk)
        try:
            await self.channel_layer.group_add(self.group, self.channel_name)
            await self.channel_layer.group_add(self.access_group, self.channel_name)
        except Exception as exc:
            if not redis_use_failed(exc):
                raise
            self.live = False
        else:
            redis_reachable()
            self.joined.set()
        await self.accept()
        if self.live:
            self.counted = True
            await sync_to_async(recorders.websocket_connected)(self.channel_name)
            self.recheck = asyncio.ensure_future(self.recheck_periodically())
        loaded = await load_history(user, job_id)
        if loaded is None:
            await self.close(code=4404)
            return
        job, messages = loaded
        self.history_seqs = {message["seq"] for message in messages}
        self.last_seq = max(self.history_seqs, default=0)
        for message in messages:
            await self.send_json(message)
        # The snapshot repeats the last history seq so the page knows where live numbering
        # resumes (a live number above it + 1 means a gap); it is not itself a new message.
        await self.send_json({"type": "status", "seq": self.last_seq, "job": str(job.pk),
                              "history_end": True,
                              "data": {"state": job.state, "kind": "snapshot", "attempt": job.attempt,
                                       "epochs_done": job.epochs_done, "priority_class": job.priority_class,
                                       "run_class": job.run_class}})
        if not self.live:
            self.closed = True
            await self.close(code=LIVE_PAUSED)

    async def refuse(self, code: int) -> None:
        """Close with ``code`` (4401 anonymous, 4404 no such job for this user). Accepted first:
        a close before the accept is an HTTP 403 at the handshake, so a real client (a
        browser, ``websockets``) never saw the code and could not tell "sign in" from "no
        access" (Channels' test communicator reports it either way). Nothing is joined or sent."""
        await self.accept()
        await self.close(code=code)

    async def disconnect(self, code):
        if getattr(self, "counted", False):
            await sync_to_async(recorders.websocket_disconnected)(self.channel_name)
        recheck = getattr(self, "recheck", None)
        if recheck is not None:
            recheck.cancel()
        if not self.live:
            return  # nothing joined, or Redis is away (channels-redis expires group entries itself)
        for group in (getattr(self, "group", None), getattr(self, "access_group", None)):
            if group:
                try:
                    await self.channel_layer.group_discard(group, self.channel_name)
                except Exception as exc:
                    if not redis_use_failed(exc):
                        raise
                    return

    async def live_lost(self, event):
        if not self.closed:
            self.closed = True
            await self.close(code=LIVE_PAUSED)

    async def access_changed(self, event):
        await self.close_unless_visible()

    async def recheck_periodically(self):
        while not self.closed:
            await asyncio.sleep(settings.WS_ACCESS_RECHECK_S)
            await self.close_unless_visible()

    async def close_unless_visible(self):
        if self.closed:
            return
        if not await database_sync_to_async(still_visible)(self.user_id, self.job_id):
            self.closed = True
            await self.close(code=4404)

    async def job_message(self, event):
        message = event["message"]
        seq = message.get("seq")
        if seq is not None and seq in getattr(self, "history_seqs", ()):
            self.history_seqs.discard(seq)  # sent as history already; each number is sent once
            return
        await self.send_json(message)

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        """The socket is one-way (clients use REST to act): what a client sends is dropped unread.
        It was decoded as JSON first, so a frame that was not JSON, or a binary one, raised here: the
        connection was cut without a close and its client stayed counted (trial28 F2)."""


class NoSuchSocket(AsyncWebsocketConsumer):
    """Every other path under the WebSocket router (``/ws/jobs/not-a-uuid/``, ``/ws/x/``): refused as a
    job that is not there, accepted then closed 4404 (see ``JobConsumer.refuse``). Channels' own answer
    was "No route found": a 500 at the handshake and a traceback in the web log, for anyone (sec19, F3).
    It uses no channel layer (an alias that names none), so no receive is started for it (see
    ``JobConsumer.channel_receive``)."""

    channel_layer_alias = "none: a refused socket receives nothing"

    async def connect(self):
        await self.accept()
        await self.close(code=4404)
