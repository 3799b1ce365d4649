"""Is the database migrated? For ``/readyz`` and for the long-running commands' start.

A database without tables (``manage.py migrate`` never run) answers ``SELECT 1``, so a web
process on it looked ready while every request was a 500, and the scheduler logged a
traceback every tick (multi-node trial M2, M7). The check asks Django's migration executor
for the plan to the newest migrations: nothing to apply = migrated. Building that plan reads
every app's migration modules, so the positive answer is kept for the life of the process
(migrations are not un-applied under a running installation); a negative one is asked again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from django.db import DEFAULT_DB_ALIAS, connections

NOT_MIGRATED = "database not migrated: run manage.py migrate"
_migrated = False


def database_migrated(alias: str = DEFAULT_DB_ALIAS) -> bool:
    """True when no migration is left to apply (kept once true); database errors propagate."""
    global _migrated
    if _migrated:
        return True
    from django.db.migrations.executor import MigrationExecutor

    connection = connections[alias]
    if "django_migrations" not in connection.introspection.table_names():
        return False
    executor = MigrationExecutor(connection)
    _migrated = not executor.migration_plan(executor.loader.graph.leaf_nodes())
    return _migrated


def wait_until_migrated(*, log: logging.Logger, stopping: Callable[[], bool] = lambda: False,
                        poll_s: float = 5.0, log_every_s: float = 60.0) -> bool:
    """Block until the database is migrated, logging :data:`NOT_MIGRATED` once a minute (a
    service started before ``migrate`` waits for it instead of crashing in a loop).
    False if ``stopping()`` became true first."""
    last_logged = None
    while not database_migrated():
        if last_logged is None or time.monotonic() - last_logged >= log_every_s:
            log.error("%s; waiting (checking every %.0f s)", NOT_MIGRATED, poll_s)
            last_logged = time.monotonic()
        connections.close_all()
        deadline = time.monotonic() + poll_s
        while time.monotonic() < deadline:
            if stopping():
                return False
            time.sleep(min(0.5, poll_s))
    if last_logged is not None:
        log.info("database migrated: going on")
    return True
