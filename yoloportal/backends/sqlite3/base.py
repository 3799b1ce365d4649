"""Django's SQLite backend, with a process's threads queueing for the write lock in the process.

SQLite has one write lock per database. A writer that finds it taken (``BEGIN IMMEDIATE``:
env.py) waits in SQLite's busy handler, which sleeps and retries — 1, 2, 5, 10, 15, 20,
25 … 100 ms — so under many concurrent writers a waiting writer wakes long after the lock
was free, and the waits make the tail of the latency (a submit's p95 at 16 clients). The
threads of one process (a web process's WEB_THREADS) instead queue on a lock of the process
before ``BEGIN IMMEDIATE``, and are handed it the moment the holder commits or rolls back;
only one writer per process still meets SQLite's busy handler. Waiting for the process's
lock is bounded by the same ``timeout`` as SQLite's own wait, and ends in the same
"database is locked" error. Everything else is Django's backend.
"""

from __future__ import annotations

import threading

from django.db.backends.sqlite3 import base
from django.db.utils import OperationalError

_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def _write_lock_for(name: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(name, threading.Lock())


class DatabaseWrapper(base.DatabaseWrapper):
    _write_lock: threading.Lock | None = None  # held from BEGIN IMMEDIATE to COMMIT/ROLLBACK/close

    def _start_transaction_under_autocommit(self):
        if self.transaction_mode not in ("IMMEDIATE", "EXCLUSIVE"):
            return super()._start_transaction_under_autocommit()  # BEGIN (deferred) takes no write lock
        lock = _write_lock_for(str(self.settings_dict["NAME"]))
        if not lock.acquire(timeout=float(self.settings_dict["OPTIONS"].get("timeout", 5))):
            raise OperationalError("database is locked (another thread of this process is writing)")
        self._write_lock = lock
        try:
            return super()._start_transaction_under_autocommit()
        except BaseException:
            self._write_lock_release()
            raise

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
