"""Django's SQLite backend, with writers handed SQLite's write lock promptly.

SQLite has one write lock per database. A writer that finds it taken (``BEGIN IMMEDIATE``:
env.py) waits in SQLite's busy handler, which sleeps and retries — 1, 2, 5, 10, 15, 20,
25 … 100 ms — so under many concurrent writers a waiting writer wakes long after the lock
was free, and the waits make the tail of the latency (a submit's p95 at 16 clients). Here:

1. The threads of one process (a web process's WEB_THREADS) queue on a lock of the process
   before ``BEGIN IMMEDIATE``, and are handed it the moment the holder commits or rolls
   back, so only one writer per process asks SQLite.
2. That one writer asks again every 0.2 ms, doubling to at most 2 ms, while another process
   holds the write lock (its ``BEGIN`` with the busy timeout at 0 for the attempt, then
   restored), instead of SQLite's sleeps. Submits from 16 clients to three web processes on
   a quiet 2-core machine: p95 113 → 88 ms (medians), the rate a little higher
   (docs/performance.md, item 20).

Both waits are bounded by the connection's ``timeout`` (the same as SQLite's own wait) and
end in the same "database is locked" error.

3. A statement's ``%s`` placeholders become SQLite's ``?`` once per statement text
   (:func:`qmark_sql`), not at every run: Django's cursor rewrites them with a regular
   expression on each ``execute`` (~20 µs for a job's 51-column INSERT, a few µs for a short
   read; docs/performance.md, item 27).

Everything else is Django's backend.
"""

from __future__ import annotations

import functools
import sqlite3
import threading
import time

from django.db.backends.sqlite3 import base
from django.db.utils import OperationalError

_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def _write_lock_for(name: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(name, threading.Lock())


# Statements longer than this are converted at each run, as by Django: a bulk INSERT of many
# rows is rarely run twice with the same text, and the cache below should stay small.
QMARK_CACHED_CHARS = 8192


@functools.lru_cache(maxsize=512)
def qmark_sql(query: str) -> str:
    """``query`` with Django's "format" placeholders as SQLite's (what ``SQLiteCursorWrapper.
    convert_query`` returns for positional parameters), remembered per statement text."""
    return base.FORMAT_QMARK_REGEX.sub("?", query).replace("%%", "%")


class CursorWrapper(base.SQLiteCursorWrapper):
    def convert_query(self, query, *, param_names=None):
        if param_names is None and len(query) <= QMARK_CACHED_CHARS:
            return qmark_sql(query)
        return super().convert_query(query, param_names=param_names)


class DatabaseWrapper(base.DatabaseWrapper):
    _write_lock: threading.Lock | None = None  # held from BEGIN IMMEDIATE to COMMIT/ROLLBACK/close
    _busy_ms = 5000  # the connection's busy timeout once open (its init commands may set it)

    def create_cursor(self, name=None):
        return self.connection.cursor(factory=CursorWrapper)

    def get_new_connection(self, conn_params):
        connection = super().get_new_connection(conn_params)
        self._busy_ms = connection.execute("PRAGMA busy_timeout").fetchone()[0]
        return connection

    def _start_transaction_under_autocommit(self):
        if self.transaction_mode not in ("IMMEDIATE", "EXCLUSIVE"):
            return super()._start_transaction_under_autocommit()  # BEGIN (deferred) takes no write lock
        lock = _write_lock_for(str(self.settings_dict["NAME"]))
        timeout = float(self.settings_dict["OPTIONS"].get("timeout", 5))
        if not lock.acquire(timeout=timeout):
            raise OperationalError("database is locked (another thread of this process is writing)")
        self._write_lock = lock
        try:
            self._begin_when_free(timeout)
        except BaseException:
            try:
                if self.connection.in_transaction:  # begun, then interrupted: nothing may stay held
                    self.connection.rollback()
            finally:
                self._write_lock_release()
            raise

    def _begin_when_free(self, timeout: float) -> None:
        """``BEGIN IMMEDIATE``, asked again every 0.2–2 ms while another process writes, for
        at most ``timeout`` seconds; the connection's busy timeout is 0 for the attempts and
        then what it was. Sent on the sqlite3 connection itself, not a Django cursor: the
        attempts are not in ``connection.queries`` nor seen by execute wrappers."""
        connection = self.connection
        deadline = time.monotonic() + timeout
        delay = 0.0002
        with self.wrap_database_errors:
            connection.execute("PRAGMA busy_timeout = 0")
            try:
                while True:
                    try:
                        connection.execute(f"BEGIN {self.transaction_mode}")
                        return
                    except sqlite3.OperationalError as exc:
                        # Extended codes too; an error of the module itself has no code.
                        busy = getattr(exc, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_BUSY
                        if not busy or time.monotonic() + delay > deadline:
                            raise
                    time.sleep(delay)
                    delay = min(2 * delay, 0.002)
            finally:
                connection.execute(f"PRAGMA busy_timeout = {int(self._busy_ms)}")

    def _write_lock_release(self) -> None:
        lock, self._write_lock = self._write_lock, None
        if lock is not None:
            lock.release()

    def _commit(self):
        try:
            return super()._commit()
        finally:
            self._write_lock_release()

    def _rollback(self):
        try:
            return super()._rollback()
        finally:
            self._write_lock_release()

    def _close(self):
        try:
            return super()._close()
        finally:
            self._write_lock_release()
