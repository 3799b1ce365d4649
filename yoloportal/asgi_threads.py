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
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import django
from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.base import BaseHandler


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

    async def get_response_async(self, request):
        # The whole synchronous chain, view included, in one hop to this request's thread.
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)


def get_asgi_application() -> ThreadPoolASGIHandler:
    """``django.core.asgi.get_asgi_application`` with the threads of ``settings.WEB_THREADS``."""
    django.setup(set_prefix=False)
    from django.conf import settings

    return ThreadPoolASGIHandler(settings.WEB_THREADS)
