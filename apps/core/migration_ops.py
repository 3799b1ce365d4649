"""Migration operations that keep a running installation writable (docs/deploy.md "Upgrades").

An index built the plain way on PostgreSQL holds a lock that blocks every INSERT and
UPDATE of the table until it is done: minutes on a large jobs table, while submits and
workers wait. These build and drop indexes CONCURRENTLY on PostgreSQL (the migration that
uses them sets ``atomic = False``, as CONCURRENTLY cannot run in a transaction) and the
plain way elsewhere.

An interrupted CONCURRENTLY build (the process killed, the connection lost, a statement
timeout, a deadlock, a unique violation) leaves the index behind marked INVALID
(``pg_index.indisvalid = false``): unused by queries, still updated by every write, and in the
way of the name. The migration is not recorded as applied, so ``migrate`` runs it again, and a
plain CREATE then failed "relation ... already exists". The build here drops such an invalid
index (CONCURRENTLY) first and builds it again. A migration of several operations keeps those
done before the interrupted one (``atomic = False``) and ``migrate`` runs it again from its first:
a valid index that is exactly the one to build, on its table, is taken as built; any other valid
index of that name is an error as before (tests/core/test_migration_ops.py; docs/deploy.md
"Upgrades"). Dropping is Django's ``DROP INDEX CONCURRENTLY IF EXISTS`` already.
"""

from __future__ import annotations

import logging

from django.db import migrations

log = logging.getLogger(__name__)


def _concurrently(schema_editor) -> dict:
    return {"concurrently": True} if schema_editor.connection.vendor == "postgresql" else {}


def _add_index(schema_editor, model, index) -> None:
    if schema_editor.connection.vendor == "postgresql" and not schema_editor.collect_sql:  # (sqlmigrate: the plan)
        if _built_before(schema_editor, model, index):
            return
    schema_editor.add_index(model, index, **_concurrently(schema_editor))


def _built_before(schema_editor, model, index) -> bool:
    """Whether an earlier, interrupted run of this migration already built ``index``.

    - INVALID (its own CONCURRENTLY build was interrupted): dropped CONCURRENTLY, so it is built again.
    - valid, on the model's table, with exactly the columns (and directions) ``index`` would build:
      built by an earlier operation of this migration before a later one was interrupted (a migration
      with ``atomic = False`` keeps what it did until then, and ``migrate`` runs it again from its
      first operation). Taken as built.
    - any other valid index of that name: False, and the build fails "already exists", as it should.
    """
    quoted = schema_editor.quote_name(index.name)
    with schema_editor.connection.cursor() as cursor:
        # to_regclass: the relation of that name on the search path, NULL when there is none.
        cursor.execute("SELECT indisvalid, indisunique, indrelid = to_regclass(%s), pg_get_indexdef(indexrelid) "
                       "FROM pg_index WHERE indexrelid = to_regclass(%s)",
                       [schema_editor.quote_name(model._meta.db_table), quoted])
        row = cursor.fetchone()
    if row is None:
        return False
    valid, unique, same_table, definition = row
    if not valid:
        log.warning("index %s is INVALID (an interrupted CONCURRENTLY build): dropped and built again", index.name)
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {quoted}")
        return False
    if same_table and not unique and definition.endswith(f" USING btree ({_columns(model, index)})") \
            and not (index.condition or index.include or index.opclasses or index.expressions):
        log.warning("index %s was built by an earlier, interrupted run of this migration: kept", index.name)
        return True
    return False


def _columns(model, index) -> str:
    """``index``'s columns as ``pg_get_indexdef`` writes them: ``state, finished_at DESC``."""
    columns = []
    for field in index.fields:
        column = model._meta.get_field(field.removeprefix("-")).column
        quoted = column if column.isidentifier() and column == column.lower() else f'"{column}"'
        columns.append(f"{quoted} DESC" if field.startswith("-") else quoted)
    return ", ".join(columns)


class AddIndexOnline(migrations.AddIndex):
    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            _add_index(schema_editor, model, self.index)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            schema_editor.remove_index(model, self.index, **_concurrently(schema_editor))


class RemoveIndexOnline(migrations.RemoveIndex):
    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            index = from_state.models[app_label, self.model_name_lower].get_index_by_name(self.name)
            schema_editor.remove_index(model, index, **_concurrently(schema_editor))

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            index = to_state.models[app_label, self.model_name_lower].get_index_by_name(self.name)
            _add_index(schema_editor, model, index)
