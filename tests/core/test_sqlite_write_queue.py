"""yoloportal/backends/sqlite3: a process's writers queue on a lock of the process before
SQLite's BEGIN IMMEDIATE (handed over at COMMIT/ROLLBACK instead of SQLite's sleep-and-retry),
and the one that asks SQLite asks again promptly while another process writes."""

from __future__ import annotations

import sqlite3
import threading

import pytest
from django.db import connection, transaction
from django.db.utils import OperationalError

from apps.accounts.models import Team

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def sqlite_only():
    if connection.vendor != "sqlite":
        pytest.skip("the SQLite backend's queue")


def in_thread(target) -> tuple[threading.Thread, list]:
    errors: list = []

    def run():
        try:
            target()
        except Exception as exc:  # noqa: BLE001 - reported to the test
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, errors


def assert_a_writer_gives_up_after(timeout: float) -> None:
    """A transaction begun in a new thread while the write lock is held fails with
    "database is locked" once ``timeout`` (its connection's) has passed."""
    options = connection.settings_dict["OPTIONS"]  # one dict for every thread's connection
    previous = options.get("timeout")
    options["timeout"] = timeout
    try:
        def waiter():
            with transaction.atomic():
                pass

        b, errors_b = in_thread(waiter)
        b.join(10)
        assert len(errors_b) == 1 and isinstance(errors_b[0], OperationalError)
        assert "database is locked" in str(errors_b[0])
    finally:
        if previous is None:
            options.pop("timeout")
        else:
            options["timeout"] = previous


def test_a_second_writer_begins_when_the_first_commits_and_both_rows_are_written():
    order: list[str] = []
    inside, release = threading.Event(), threading.Event()

    def first():
        with transaction.atomic():
            order.append("first began")
            Team.objects.create(slug="first", name="first")
            inside.set()
            release.wait(10)
            order.append("first commits")

    def second():
        inside.wait(10)
        with transaction.atomic():
            order.append("second began")
            Team.objects.create(slug="second", name="second")

    a, errors_a = in_thread(first)
    inside.wait(10)
    b, errors_b = in_thread(second)
    b.join(0.3)
    assert b.is_alive() and order == ["first began"]  # waiting, on the process's lock
    release.set()
    a.join(10), b.join(10)
    assert errors_a == errors_b == []
    assert order == ["first began", "first commits", "second began"]
    assert set(Team.objects.filter(slug__in=["first", "second"]).values_list("slug", flat=True)) == {"first",
                                                                                                  "second"}


def test_a_rolled_back_writer_hands_the_lock_on_and_a_wait_is_bounded_by_the_timeout():
    inside, release = threading.Event(), threading.Event()

    def holder():
        with transaction.atomic():
            inside.set()
            release.wait(10)
            raise RuntimeError("rolled back")

    a, errors_a = in_thread(holder)
    inside.wait(10)
    assert_a_writer_gives_up_after(0.2)
    release.set()
    a.join(10)
    assert [type(e) for e in errors_a] == [RuntimeError]
    with transaction.atomic():  # the rollback released it
        Team.objects.create(slug="after", name="after")


def test_a_writer_of_another_process_is_waited_for_then_past_the_timeout_refused():
    """Another process's write lock (here a connection of its own, which this process's queue
    does not know): BEGIN IMMEDIATE is asked again until the lock is free, then the
    transaction runs; the connection's busy timeout is what it was afterwards; and a lock
    held past the timeout ends in "database is locked"."""
    other = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None, timeout=5)
    try:
        other.execute("BEGIN IMMEDIATE")
        began: list[str] = []
        busy_ms: list[int] = []

        def writer():
            with connection.cursor() as cursor:  # this thread's connection, before and after its wait
                cursor.execute("PRAGMA busy_timeout")
                busy_ms.append(cursor.fetchone()[0])
            with transaction.atomic():
                began.append("began")
                Team.objects.create(slug="after-other", name="after-other")
            with connection.cursor() as cursor:
                cursor.execute("PRAGMA busy_timeout")
                busy_ms.append(cursor.fetchone()[0])

        a, errors_a = in_thread(writer)
        a.join(0.3)
        assert a.is_alive() and began == []  # waiting for the other process
        other.execute("ROLLBACK")
        a.join(10)
        assert errors_a == [] and began == ["began"]
        assert Team.objects.filter(slug="after-other").exists()
        assert len(busy_ms) == 2 and busy_ms[0] == busy_ms[1] > 0  # what it was before the wait

        other.execute("BEGIN IMMEDIATE")
        assert_a_writer_gives_up_after(0.2)
    finally:
        if other.in_transaction:
            other.execute("ROLLBACK")
        other.close()
    with transaction.atomic():  # nothing left held
        Team.objects.create(slug="after-timeout", name="after-timeout")


def test_placeholders_are_converted_as_django_does_once_per_statement():
    """Django's cursor rewrites ``%s`` as ``?`` with a regular expression on every execute; the
    backend's cursor remembers the rewrite per statement text (docs/performance.md, item 27)."""
    from django.db.backends.sqlite3.base import SQLiteCursorWrapper

    from yoloportal.backends.sqlite3.base import QMARK_CACHED_CHARS, CursorWrapper, qmark_sql

    with connection.cursor() as cursor:
        assert isinstance(cursor.cursor, CursorWrapper)
        cursor.execute("SELECT %s || '%%s' || '%%', %s", ["a", "b"])
        assert cursor.fetchone() == ("a%s%", "b")
        cursor.execute("SELECT %(x)s, %(y)s", {"x": 1, "y": 2})  # Django's named style: converted as before
        assert cursor.fetchone() == (1, 2)
    django = SQLiteCursorWrapper.convert_query
    for sql in ("SELECT %s, '%%s', '%%', %s", "INSERT INTO t VALUES (%s)", "SELECT 1"):
        assert qmark_sql(sql) == django(None, sql)
    qmark_sql.cache_clear()
    long = "SELECT " + " + ".join(["%s"] * (QMARK_CACHED_CHARS // 4))
    with connection.cursor() as cursor:
        assert cursor.cursor.convert_query(long) == django(None, long)
    assert qmark_sql.cache_info().currsize == 0  # a long statement is converted, not kept
