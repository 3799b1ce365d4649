"""apps/core/migration_ops.py: an interrupted CONCURRENTLY build does not block the next `migrate`.

PostgreSQL leaves an index whose CONCURRENTLY build failed in place, marked INVALID; the
migration is not recorded, so `migrate` runs it again, and the build then failed "relation
... already exists" (operator trial 29, noted). The interrupted build is simulated as one that
fails on a unique violation: the same INVALID leftover a killed process or a lost connection
leaves. Run on PostgreSQL with DATABASE_URL (scripts/postgres.sh); the SQLite test runs without.
"""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.db import DatabaseError, IntegrityError, connection, models
from django.db.migrations.loader import MigrationLoader

from apps.core.migration_ops import AddIndexOnline, RemoveIndexOnline

pytestmark = pytest.mark.django_db(transaction=True)  # CONCURRENTLY cannot run in a transaction

NAME = "probe_user_first_name"
postgresql = pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL (DATABASE_URL)")
sqlite = pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite")


def build(operation) -> None:
    """``operation`` applied forwards as `migrate` would, on the project's current state."""
    state = MigrationLoader(connection).project_state()
    after = state.clone()
    operation.state_forwards("auth", after)
    with connection.schema_editor(atomic=False) as editor:
        operation.database_forwards("auth", editor, state, after)


def index_row(name: str):
    """(valid, unique, columns) of the index ``name``, None when there is none (PostgreSQL)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.indisvalid, i.indisunique, pg_get_indexdef(i.indexrelid) FROM pg_index i "
            "WHERE i.indexrelid = to_regclass(%s)",
            [name],
        )
        return cursor.fetchone()


@pytest.fixture
def twins():
    """Two users with the same first name: a unique build over it fails half way."""
    users = get_user_model()
    users.objects.create(username="twin-a", first_name="same")
    users.objects.create(username="twin-b", first_name="same")
    yield users._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"DROP INDEX IF EXISTS {NAME}")


def operation() -> AddIndexOnline:
    return AddIndexOnline(model_name="user", index=models.Index(fields=["first_name"], name=NAME))


@postgresql
def test_an_invalid_index_left_by_an_interrupted_build_is_dropped_and_built_again(twins):
    with pytest.raises(IntegrityError), connection.cursor() as cursor:
        cursor.execute(f"CREATE UNIQUE INDEX CONCURRENTLY {NAME} ON {twins} (first_name)")
    assert index_row(NAME)[:2] == (False, True)  # what the interrupted build left: INVALID

    build(operation())  # was: relation "probe_user_first_name" already exists

    valid, unique, definition = index_row(NAME)
    assert valid and not unique and definition.endswith("(first_name)")


@postgresql
def test_the_same_index_built_by_an_interrupted_earlier_run_is_taken_as_built(twins):
    """A migration of several online operations (atomic = False) keeps what it did before the one
    interrupted, and `migrate` runs it again from the first: that first index "already exists"
    stopped the re-run (ops29, noted)."""
    build(operation())
    build(operation())  # was: relation "probe_user_first_name" already exists
    valid, unique, definition = index_row(NAME)
    assert valid and not unique and definition.endswith("(first_name)")


@postgresql
@pytest.mark.parametrize("other", ["CREATE INDEX {name} ON {table} (last_name)",
                                   "CREATE INDEX {name} ON {table} (first_name DESC)",
                                   "CREATE UNIQUE INDEX {name} ON {table} (username)",
                                   "CREATE INDEX {name} ON {table} (first_name) WHERE is_staff"])
def test_another_valid_index_of_that_name_is_still_an_error(twins, other):
    with connection.cursor() as cursor:
        cursor.execute(other.format(name=NAME, table=twins))
    with pytest.raises(DatabaseError, match="already exists"):
        build(operation())
    assert index_row(NAME)[0] is True  # left as it was


@postgresql
def test_removing_the_index_back_rebuilds_an_invalid_leftover(twins):
    """RemoveIndexOnline's backwards builds the index: the same recovery."""
    build(operation())
    state = MigrationLoader(connection).project_state()
    op = operation()
    op.state_forwards("auth", state)
    with connection.cursor() as cursor:
        cursor.execute(f"DROP INDEX {NAME}")
    with pytest.raises(IntegrityError), connection.cursor() as cursor:
        cursor.execute(f"CREATE UNIQUE INDEX CONCURRENTLY {NAME} ON {twins} (first_name)")
    remove = RemoveIndexOnline(model_name="user", name=NAME)
    after = state.clone()
    remove.state_forwards("auth", after)
    with connection.schema_editor(atomic=False) as editor:
        remove.database_backwards("auth", editor, after, state)
    assert index_row(NAME)[:2] == (True, False)


@sqlite
def test_sqlite_builds_the_plain_index_as_before(twins):
    build(operation())
    with connection.cursor() as cursor:
        indexes = connection.introspection.get_constraints(cursor, twins)
    assert indexes[NAME]["index"] and indexes[NAME]["columns"] == ["first_name"]
    with pytest.raises(DatabaseError, match="already exists"):
        build(operation())
