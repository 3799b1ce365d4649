"""Django's Redis cache, keeping one client object per connection pool.

Django's ``RedisCacheClient.get_client`` builds a new ``redis.Redis`` for every cache call,
and each one builds redis-py's table of ~1,000 response callbacks: about half a
millisecond of CPU, twice per throttled request. A client is safe to share between threads
(it takes a connection from the pool per command), so one per pool is enough.

Django also makes a new cache *object* per thread and per async context (``caches`` is an
asgiref ``Local``): under ASGI that is a new one per request, each with its own connection
pool, so every request connected to Redis afresh (a TCP connect, HELLO and a health check:
a third of a submit's Redis time). The clients here are shared by every cache object of the
process with the same servers and options (redis-py pools are thread-safe and start over
in a forked child).
"""

from __future__ import annotations

import threading

import redis
from django.core.cache.backends.redis import RedisCache as DjangoRedisCache
from django.core.cache.backends.redis import RedisCacheClient
from django.utils.functional import cached_property


class ReusingRedisCacheClient(RedisCacheClient):
    def get_client(self, key=None, *, write=False):
        pool = self._get_connection_pool(write)
        clients = self.__dict__.setdefault("_clients", {})
        client = clients.get(id(pool))
        if client is None:
            client = clients[id(pool)] = self._client(connection_pool=pool)
        return client


_SHARED: dict[tuple, ReusingRedisCacheClient] = {}
_SHARED_LOCK = threading.Lock()


class RedisCache(DjangoRedisCache):
    def __init__(self, server, params):
        super().__init__(server, params)
        self._class = ReusingRedisCacheClient

    @cached_property
    def _cache(self) -> ReusingRedisCacheClient:
        key = (tuple(self._servers), repr(sorted(self._options.items())))
        with _SHARED_LOCK:
            client = _SHARED.get(key)
            if client is None:
                client = _SHARED[key] = self._class(self._servers, **self._options)
        return client

    def redis(self, key: str = "") -> redis.Redis:
        """The redis-py client the cache writes ``key`` with, for what the cache API cannot
        say in one round trip (apps.accounts.throttles counts with a script)."""
        return self._cache.get_client(key, write=True)
