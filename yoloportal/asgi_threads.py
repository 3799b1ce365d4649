"""Django's ASGI handler, with each request's synchronous work in one hop on a long-lived thread.

Django's own handler, for a project whose middleware and views are synchronous (ours: the
HTTP side; the websockets are channels consumers), builds an *async* middleware chain and
crosses between the event loop and a worker thread for each middleware method and again
for the view — about fifteen thread hand-overs per request, each a GIL round trip — on a
thread made for that request (``ThreadSensitiveContext()``), so each request also opened a
new database connection (connections are per thread) and ``CONN_MAX_AGE`` never applied.
Through uvicorn a submit cost about twice its in-process CPU time (docs/performance.md).

Here the middleware chain is the synchronous one (as under WSGI) and runs, view included,
in a single ``sync_to_async`` call. Each process keeps ``WEB_THREADS`` single-thread
executors and gives each request the least busy one (asgiref's
``ThreadSensitiveContext(executor=…)``: the caller owns the executor), so a thread's
database connection outlives its requests like a WSGI worker thread's; Django still
closes it after ``CONN_MAX_AGE`` or an error (``close_old_connections`` on request start
and finish). A request that waits (an upload being unpacked, a lock) holds only its own
thread; the others keep serving. Reading the body and sending the response stay async.

The one remaining hop costs ~10 % of a submit's GIL time under the bench's load (py-spy
--gil: ~7 % in the thread's ``call_soon_threadsafe``, ~2 % in the executor's ``submit``).
Running the submit view on the event loop's own thread instead (no hop; the loop hidden
from Django's async-unsafe check for the call) was measured and is *slower*:
a process then serves one request at a time and blocks on every wait — SQLite's busy
handler sleeping between tries for another process's write lock, each PostgreSQL round
trip — so submits fell to 0.64 of sbatch (threads 0.69) on SQLite and 0.38 (0.56) on
PostgreSQL, and six such processes did worse still (docs/performance.md, item 19).

Django's ``handle`` makes two more hops per request (the ``request_started`` signal's
receivers and ``response.close()``, which sends ``request_finished``, each run through
``sync_to_async``) and runs the view as one of two tasks beside a task that waits for the
client to disconnect — which can only cancel an *async* view. Here the signal, the request,
the view and, for a response whose body is already in memory, ``close()`` run in the same
hop, and only a streaming response (a file) is sent beside a disconnect listener that stops
it. Same order as Django's: request_started, view, request_finished (for an in-memory body
a moment before its bytes go out rather than after: nothing is sent from it).

A streaming response with a *synchronous* iterator (every ``FileResponse``: weights, exports,
samples) is pulled one block at a time on the request's thread (:meth:`pulled`) while the
event loop sends each block before asking for the next; Django's own ``send_response`` would
read the whole file into a list first (see :meth:`pulled` for why and what that cost).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from concurrent.futures import ThreadPoolExecutor

import django
from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.base import BaseHandler
from django.urls import set_script_prefix


class ThreadPoolASGIHandler(ASGIHandler):
    def __init__(self, threads: int) -> None:
        BaseHandler.__init__(self)
        self.load_middleware(is_async=False)  # the WSGI chain: no hops between middleware
        self.executors = [ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"django-{n}")
                          for n in range(max(1, threads))]
        self.busy = [0] * len(self.executors)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        # The event loop is one thread: picking and counting need no lock.
        n = min(range(len(self.busy)), key=self.busy.__getitem__)
        self.busy[n] += 1
        try:
            async with ThreadSensitiveContext(executor=self.executors[n]):
                await self.handle(scope, receive, send)
        finally:
            self.busy[n] -= 1

    async def handle(self, scope, receive, send):
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        try:
            # The whole synchronous part, view included, in one hop to this request's thread.
            response = await sync_to_async(self.respond, thread_sensitive=True)(scope, body_file)
            if not response.streaming:
                await self.send_response(response, send)
                return
            await self.send_streaming(response, receive, send)
        finally:
            body_file.close()

    def respond(self, scope, body_file):
        set_script_prefix(get_script_prefix(scope))
        signals.request_started.send(sender=self.__class__, scope=scope)
        request, response = self.create_request(scope, body_file)
        if request is not None:
            response = self.get_response(request)
            response._handler_class = self.__class__
            if response.streaming:
                response.block_size = self.chunk_size  # a FileResponse: the server chunks it
        if not response.streaming:
            response.close()  # request_finished: its bytes are in memory
        return response

    async def send_streaming(self, response, receive, send):
        """Django's way: stop sending when the client goes away; close() after."""
        if not response.is_async:
            response.streaming_content = self.pulled(response.streaming_content)
        sending = asyncio.create_task(self.send_response(response, send))
        listening = asyncio.create_task(self.listen_for_disconnect(receive))
        try:
            await asyncio.wait([sending, listening], return_when=asyncio.FIRST_COMPLETED)
            for task in (listening, sending):
                if not task.done():
                    task.cancel()
                try:
                    await task
                except (asyncio.CancelledError, RequestAborted):
                    pass
        finally:
            await sync_to_async(response.close, thread_sensitive=True)()

    @staticmethod
    async def pulled(blocks: Iterable[bytes]) -> AsyncIterator[bytes]:
        """A synchronous iterator's blocks, each read on the request's thread when the last is sent.

        Gotcha (Django 5.2, ``StreamingHttpResponse.__aiter__``): under ASGI a synchronous
        iterator is consumed with ``sync_to_async(list)`` — the *whole* file is read into memory
        before its first byte is sent (the "must consume synchronous iterators" warning): a
        128 MiB weights download grew uvicorn's process by 128 MiB or more (1 GB: by 1 GB), and
        a client that left after the first megabyte still had the whole file read. Here one
        block is read per hop (``FileResponse.block_size``, set in :meth:`respond`), and the
        next only once the server took the last: uvicorn's ``send`` waits while the socket's
        buffer is full, so a slow client holds back the reading (backpressure) and memory stays
        a few blocks whatever the file's size (tests/test_asgi_threads.py,
        tests/integration/test_download_memory.py).
        When the client leaves, :meth:`send_streaming` cancels the task awaiting a block; the
        block being read finishes on the request's one thread and ``response.close()`` (the
        file's) runs after it on that same thread — no thread is made or left behind.
        """
        read_next = sync_to_async(next, thread_sensitive=True)
        blocks = iter(blocks)
        while (block := await read_next(blocks, None)) is not None:
            yield block


def get_asgi_application() -> ThreadPoolASGIHandler:
    """``django.core.asgi.get_asgi_application`` with the threads of ``settings.WEB_THREADS``."""
    django.setup(set_prefix=False)
    from django.conf import settings

    return ThreadPoolASGIHandler(settings.WEB_THREADS)
