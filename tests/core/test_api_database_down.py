"""An API request the database does not answer in time is a 503 that says so, not a 500.

fault32: another process held SQLite's write lock for 45 s (a backup, an `sqlite3` shell); a
submit waited the busy timeout and was answered "500 Internal Server Error" with a traceback in
the web's log; `yoloq` said only that the server was not reachable.
"""

from __future__ import annotations

import subprocess
import sys
from contextlib import contextmanager

import pytest
from django.db import connection

from apps.jobs.models import Job
from tests.conftest import SEED_SPEC, api_client

pytestmark = pytest.mark.django_db(transaction=True)

HOLD_WRITE_LOCK = """
import sqlite3, sys, time
connection = sqlite3.connect(sys.argv[1], isolation_level=None)
connection.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.read()  # until the test closes it
connection.execute("COMMIT")
"""


@contextmanager
def write_lock_held():
    """Another process holds the database's write lock; the busy timeout is 1 s, not 30, meanwhile."""
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's write lock (PostgreSQL waits on row locks without a timeout)")
    options = connection.settings_dict["OPTIONS"]
    timeout = options.get("timeout")
    options["timeout"] = 1  # a transaction's BEGIN (yoloportal/backends/sqlite3)
    connection.ensure_connection()
    busy_ms = connection._busy_ms
    connection._busy_ms = 1000  # a statement outside one
    connection.connection.execute("PRAGMA busy_timeout = 1000")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_WRITE_LOCK, connection.settings_dict["NAME"]],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        yield
    finally:
        holder.stdin.close()
        assert holder.wait(10) == 0
        options["timeout"] = timeout
        connection._busy_ms = busy_ms
        connection.connection.execute(f"PRAGMA busy_timeout = {busy_ms}")


def test_a_submit_the_database_does_not_answer_is_a_503_that_says_what_to_do(alice, demo_registered):
    client = api_client(alice)  # its token is written before the lock
    with write_lock_held():
        response = client.post("/api/v1/jobs/", SEED_SPEC, content_type="application/yaml")
    assert response.status_code == 503, response.content
    assert response["Retry-After"] == "30"
    detail = response.json()["detail"]
    assert detail.startswith(
        "The database did not answer in time (OperationalError): the request may not have "
        "been carried out. Try again in a minute"
    ), detail
    assert not Job.objects.exists()
    again = client.post("/api/v1/jobs/", SEED_SPEC, content_type="application/yaml")
    assert again.status_code == 201, again.content


def test_only_a_database_that_did_not_answer_is_said_so_an_error_in_what_was_asked_stays_a_bug():
    """A 503 "try again" for a missing table (a migration not run) or bad SQL would hide a bug
    behind a retry forever, and a training worker would wait 10 minutes on it."""
    import sqlite3

    from django.db import InterfaceError, OperationalError, ProgrammingError

    from apps.core.errors import database_unanswered

    def wrapped(message: str, cause: BaseException | None) -> OperationalError:
        exc = OperationalError(message)
        exc.__cause__ = cause
        return exc

    assert database_unanswered(wrapped("database is locked", sqlite3.OperationalError("database is locked")))
    assert database_unanswered(wrapped("database is locked (another thread of this process is writing)", None))
    assert database_unanswered(InterfaceError("connection already closed"))
    assert not database_unanswered(wrapped("no such table: jobs_job", sqlite3.OperationalError("no such table")))
    assert not database_unanswered(wrapped('near "SELEC": syntax error', sqlite3.OperationalError("syntax")))
    assert not database_unanswered(ProgrammingError("relation \"jobs_job\" does not exist"))
    assert not database_unanswered(ValueError("database is locked"))
    psycopg = pytest.importorskip("psycopg")
    assert database_unanswered(wrapped("connection refused", psycopg.OperationalError("connection refused")))
