"""Reads on hot paths whose SQL the ORM writes once per database connection.

Building a queryset and compiling it costs 0.3–0.7 ms of CPU each time (filters, the
select list of every column, joins, ordering, quoting); running the SQL it yields on an
indexed table costs tens of microseconds. Token authentication (every API request) and a
submit's checks run the same few queries with different values, so :class:`PreparedRead`
compiles each once per connection and then only runs it:

1. ``build(**samples)`` makes the queryset, compiled by the ORM as usual; ``build`` is
   compiled again with a second set of sample values, and the two SQL texts must be equal
   with only the parameters' values differing (else ValueError at first use: the query's
   shape depends on its values, and it cannot be prepared).
2. A call substitutes its values (of the samples' types: ints and strings) at those
   positions and runs the SQL on the current thread's connection.
3. Rows become what the queryset would have returned — model instances (with
   ``select_related`` rows) or ``values_list`` tuples — through the compiler's own select
   list and converters, kept from step 1.

The compiled query is kept on the connection object (each thread has its own), so
converters and parameters always belong to the connection that runs them.

On PostgreSQL the statements of this module (reads and inserts) are also *prepared on the
server*: :func:`statement_cursor` binds their parameters on the server, so psycopg prepares
each after a few runs on a connection (``prepare_threshold``, yoloportal/env.py) and the
server then skips parsing, analysing and planning it — about a third of a submit's CPU in
its PostgreSQL backend (docs/performance.md, item 23). Every other query keeps Django's
client-side binding. psycopg forgets a connection's prepared statements at any rollback
(a savepoint's too, e.g. a submit refused at the active-job cap); they are prepared again
after ``prepare_threshold`` runs.
"""

from __future__ import annotations

import contextlib
import functools
import operator
import re
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Field, QuerySet
from django.db.models.query import ModelIterable, get_related_populators


class PreparedRead:
    def __init__(self, build: Callable[..., QuerySet], samples: tuple[dict[str, Any], dict[str, Any]], *,
                 using: str = DEFAULT_DB_ALIAS) -> None:
        first, second = samples
        if set(first) != set(second) or any(first[k] == second[k] for k in first):
            raise ValueError("two sample sets with the same names and different values are needed")
        if any(type(v) not in (int, str) or type(second[k]) is not type(v) for k, v in first.items()):
            raise ValueError("sample values are ints or strings, the same type in both sets")
        self.build = build
        self.samples = samples
        self.alias = using
        self._compiled: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __call__(self, **values: Any) -> list:
        self.check(values)
        if _ahead.answers and (rows := _ahead.answers.pop((self, *sorted(values.items())), None)) is not None:
            return rows  # read ahead, with other reads, in one statement (reads_ahead)
        connection = connections[self.alias]
        return self.compiled(connection).run(values, connection)

    def check(self, values: dict[str, Any]) -> None:
        if set(values) != set(self.samples[0]):
            raise TypeError(f"expected the values {sorted(self.samples[0])}, got {sorted(values)}")
        for name, value in values.items():
            if type(value) is not type(self.samples[0][name]):
                raise TypeError(f"{name} must be a {type(self.samples[0][name]).__name__}, got {value!r}")

    def compiled(self, connection) -> _Compiled:
        compiled = self._compiled.get(connection)
        if compiled is None:
            compiled = self._compiled[connection] = _Compiled(self.build(**self.samples[0]),
                                                              self.build(**self.samples[1]), self.samples, connection)
        return compiled


class _Compiled:
    def __init__(self, queryset: QuerySet, other: QuerySet, samples: tuple[dict, dict], connection) -> None:
        compiler = queryset.query.get_compiler(connection=connection)
        self.sql, params = compiler.as_sql()
        other_sql, other_params = other.query.get_compiler(connection=connection).as_sql()
        if other_sql != self.sql or len(other_params) != len(params):
            raise ValueError(f"the query's SQL depends on its values; it cannot be prepared: {self.sql}")
        self.params = list(params)
        self.slots: dict[str, list[int]] = {name: [] for name in samples[0]}
        # The type the ORM gave each value (PostgreSQL: psycopg's Int8 for a bigint column), so
        # a value is sent as the ORM would send it: bound on the server, a plain int would be
        # typed by its size, and each size would be another prepared statement.
        self.kinds: dict[int, type] = {}
        for i, (a, b) in enumerate(zip(params, other_params, strict=True)):
            if a == b:
                continue
            names = [n for n in samples[0] if samples[0][n] == a and samples[1][n] == b]
            if len(names) != 1:
                raise ValueError(f"parameter {i} of the prepared SQL is not one of the values as given: {self.sql}")
            self.slots[names[0]].append(i)
            if type(a) not in (int, str):
                self.kinds[i] = type(a)
        if not all(self.slots.values()):
            raise ValueError(f"a value does not reach the SQL: {self.slots}")
        if binds_on_server(connection):
            self._constants_into_text(connection)
        self.compiler = compiler
        self.models = queryset._iterable_class is ModelIterable
        self.converters = compiler.get_converters([s[0] for s in compiler.select])
        if self.models:
            klass_info = compiler.klass_info
            fields = klass_info["select_fields"]
            self.model, self.start, self.end = klass_info["model"], fields[0], fields[-1] + 1
            self.init_list = [s[0].target.attname for s in compiler.select[self.start:self.end]]
            self.related = get_related_populators(klass_info, compiler.select, connection.alias)
        elif queryset._fields is None or queryset._iterable_class.__name__ not in (
                "ValuesListIterable", "FlatValuesListIterable"):
            raise ValueError("only model rows and values_list() can be prepared")
        self.flat = queryset._iterable_class.__name__ == "FlatValuesListIterable"

    def _constants_into_text(self, connection) -> None:
        """Write the parameters that are the same on every call (the ORM's constants, as the
        ``''`` of ``exclude(idempotency_key="")``) into the SQL as literals, and bind only the
        call's values. Bound on the server, a prepared statement's generic plan (planned once
        for any values) cannot see a bound constant: the replay check's ``NOT (key = $3)``
        does not prove the partial unique index's ``key <> ''``, and that plan read every job
        of the user (tests/jobs/test_indexes.py)."""
        from psycopg.sql import Literal

        connection.ensure_connection()  # the literals are quoted by the connection's adapters
        kept: dict[int, int] = {}  # old position → new
        pieces = re.split(r"(%%|%s)", self.sql)
        position = 0
        for n, piece in enumerate(pieces):
            if piece != "%s":
                continue
            if any(position in slots for slots in self.slots.values()):
                kept[position] = len(kept)
            else:
                pieces[n] = Literal(self.params[position]).as_string(connection.connection).replace("%", "%%")
            position += 1
        self.sql = "".join(pieces)
        self.params = [self.params[old] for old in kept]
        self.slots = {name: [kept[i] for i in positions] for name, positions in self.slots.items()}
        self.kinds = {kept[i]: kind for i, kind in self.kinds.items()}

    def bound(self, values: dict[str, Any]) -> list:
        """The parameters of one run: the compiled ones with the call's values in their slots."""
        params = list(self.params)
        kinds = self.kinds
        for name, positions in self.slots.items():
            for i in positions:
                params[i] = kinds[i](values[name]) if i in kinds else values[name]
        return params

    def run(self, values: dict[str, Any], connection) -> list:
        params = self.bound(values)
        with statement_cursor(connection) as cursor:
            cursor.execute(self.sql, params)
            rows = cursor.fetchall()
        return self.results(rows, connection)

    def results(self, rows: list, connection) -> list:
        """The database's rows of this statement as the queryset would return them."""
        if self.converters:
            rows = list(self.compiler.apply_converters(rows, self.converters))
        if not self.models:
            return [row[0] for row in rows] if self.flat else [tuple(row) for row in rows]
        objects = []
        for row in rows:
            obj = self.model.from_db(connection.alias, self.init_list, row[self.start:self.end])
            for populator in self.related:
                populator.populate(row, obj)
            objects.append(obj)
        return objects


class _Ahead(threading.local):
    def __init__(self) -> None:
        self.answers: dict[tuple, list] = {}  # (read, *sorted values) → its rows, until asked for


_ahead = _Ahead()


@contextlib.contextmanager
def reads_ahead(calls: Sequence[tuple[PreparedRead, dict[str, Any]]]) -> Iterator[None]:
    """Within the block, each of ``calls`` (a :class:`PreparedRead` and its values) is answered
    from one statement run on entry instead of a round trip of its own, the first time it is
    made with exactly those values on this thread (a later call, or one with other values,
    runs as usual); what nobody asked for is forgotten at the end of the block.

    On PostgreSQL only, and for two or more calls: a submit's independent reads (the replay
    check and the teams; then the dataset and the registry name) each cost a round trip, that is
    a wake-up of the server's backend and of the request's thread (docs/performance.md, item 26).
    On SQLite, which has no round trips, every read runs when it is made, as without the block.
    The caller names only reads its own code would make next, with the same values: an answer
    is the same rows the read would return, read a moment earlier (these reads run outside any
    transaction, so nothing is promised between them anyway).

    A write within the block (any statement on the connection but a SELECT or a savepoint's) forgets
    the answers not yet asked for: a read made after it runs as usual, and sees it."""
    answers = _ahead.answers
    pending = {key: (read, values) for read, values in calls
               if (key := (read, *sorted(values.items()))) not in answers}  # an outer block's stay its own
    kept = []
    if len(pending) > 1 and _foldable(list(pending.values())):
        for read, values in pending.values():
            read.check(values)
        for key, rows in zip(pending, _reads_together(list(pending.values())), strict=True):
            answers[key] = rows
            kept.append(key)
    if not kept:
        yield
        return

    def forget_at_a_write(execute, sql, params, many, context):
        if not (isinstance(sql, str) and _NOT_A_WRITE.match(sql)):
            for key in kept:
                answers.pop(key, None)
        return execute(sql, params, many, context)

    try:
        with connections[calls[0][0].alias].execute_wrapper(forget_at_a_write):
            yield
    finally:
        for key in kept:
            answers.pop(key, None)


# What leaves the rows read ahead as they are: a read, a savepoint made or released (every other
# statement may change them: an INSERT, an UPDATE, a ROLLBACK TO SAVEPOINT after a write, ...).
_NOT_A_WRITE = re.compile(r"\s*(SELECT\b|SAVEPOINT\b|RELEASE\s+SAVEPOINT\b)", re.IGNORECASE)


def _foldable(calls: Sequence[tuple[PreparedRead, dict[str, Any]]]) -> bool:
    alias = calls[0][0].alias
    connection = connections[alias]
    return connection.vendor == "postgresql" and all(read.alias == alias for read, _ in calls) and not any(
        read.compiled(connection).compiler.has_extra_select for read, _ in calls)


def _reads_together(calls: Sequence[tuple[PreparedRead, dict[str, Any]]]) -> list[list]:
    """Each call's rows, from one statement (:func:`_together_reads_sql`)."""
    connection = connections[calls[0][0].alias]
    reads = tuple(read.compiled(connection) for read, _ in calls)
    known = _reads_sql.setdefault(connection, {})
    sql = known.get(reads)
    if sql is None:
        sql = known[reads] = _together_reads_sql(reads, connection)
    params = [value for (_, values), read in zip(calls, reads, strict=True) for value in read.bound(values)]
    with statement_cursor(connection) as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    answers: list[list] = [[] for _ in reads]
    offsets, offset = [], 1
    for read in reads:
        offsets.append(offset)
        offset += 1 + len(read.compiler.select)
    for row in rows:
        n = row[0]
        start = offsets[n]
        if row[start] is not None:  # the arm's row number: None where the read found nothing
            answers[n].append(row[start + 1:start + 1 + len(reads[n].compiler.select)])
    return [read.results(found, connection) for read, found in zip(reads, answers, strict=True)]


_reads_sql: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # connection → {reads: SQL}


def _together_reads_sql(reads: tuple[_Compiled, ...], connection) -> str:
    """``SELECT "ahead"."n", "read_0".*, "read_1".* … FROM (VALUES (0), (1) …) "ahead" ("n") LEFT JOIN
    (SELECT row_number() OVER (), * FROM (<read 0>)) "read_0" ON "ahead"."n" = 0 LEFT JOIN …
    ORDER BY "ahead"."n", "read_0"."ahead_row", …``.

    Each read's rows come out on rows tagged with its number, its columns where they are in its
    own statement (so its converters apply) and NULL in the other reads' columns, with their
    types (a ``UNION ALL`` of reads of different shapes would have to cast each NULL); a read
    that finds nothing gives one row whose row number is NULL. The row number keeps each read's
    own order (a read's ORDER BY); ``row_number() OVER ()`` numbers its sub-select's rows in the
    order that sub-select returns them.
    """
    quote = connection.ops.quote_name
    tag, row, inner = f"{quote('ahead')}.{quote('n')}", quote("ahead_row"), quote("read")
    names = [quote(f"read_{n}") for n in range(len(reads))]
    joins = " ".join(f"LEFT JOIN (SELECT row_number() OVER () AS {row}, {inner}.* FROM ({read.sql}) {inner}) "
                     f"{name} ON {tag} = {n}" for n, (read, name) in enumerate(zip(reads, names, strict=True)))
    tags = ", ".join(f"({n})" for n in range(len(reads)))
    return (f"SELECT {tag}, {', '.join(name + '.*' for name in names)} "
            f"FROM (VALUES {tags}) {quote('ahead')} ({quote('n')}) {joins} "
            f"ORDER BY {tag}, {', '.join(f'{name}.{row}' for name in names)}")


class PreparedInsert:
    """``Model.objects.create(**values)`` with the INSERT's SQL compiled once per connection.

    Django builds an INSERT anew for every row: quoting every column, asking each field for
    its placeholder, assembling the statement (a job has ~45 columns: about a third of a
    submit's ORM time). Here the statement comes from Django's own compiler once per
    connection, for the model's columns as ``save()`` would send them; each call then only
    converts its values, as the compiler does (``pre_save`` and ``get_db_prep_save``), and
    reads back what the database returns (an auto primary key), through the compiler's
    converters. The row is a saved instance, as ``create()`` returns.

    ``create()`` itself runs instead when its shortcut would differ: a model with its own
    ``save()``, ``pre_save``/``post_save`` listeners, a field with a database default or a
    generated field, a value that is an expression, or a field whose placeholder is not ``%s``.

    ``save_guards_updates_only=True`` says the model's own ``save()`` does nothing for a new
    row but call ``Model.save`` (it only refuses or changes *updates*, as the append-only
    ``AuditEntry`` does): an insert may then skip it. Only a model whose ``save()`` says so
    in a comment may be prepared this way; its test compares the row with ``create()``'s.
    """

    def __init__(self, model, *, using: str = DEFAULT_DB_ALIAS, save_guards_updates_only: bool = False) -> None:
        from django.db.models import Model

        self.model = model
        self.alias = using
        meta = model._meta
        self.plain = ((model.save is Model.save or save_guards_updates_only) and model.save_base is Model.save_base
                      # A database default with a Python default too is sent like any value (Job's
                      # resume_chosen_attempt: the default is there for the previous release's inserts).
                      and not any(f.generated or (f.has_db_default() and not f.has_default())
                                  for f in meta.local_concrete_fields))
        self._compiled: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __call__(self, **values: Any):
        return self.prepare(**values).run()

    def prepare(self, **values: Any) -> PendingRow:
        """The row made and its values converted now, inserted by ``.run()`` later (on the same
        thread): a caller converts its rows before it takes a lock and holds the lock only
        for the statements. ``.obj`` is the instance (its primary key is known before the
        insert when it has a default, as a uuid has)."""
        from django.db.models import signals

        model = self.model
        if frozenset(values) & model._meta._reverse_one_to_one_field_names:
            return model._default_manager.using(self.alias).create(**values)  # raises create()'s ValueError
        obj = model(**values)
        if (not self.plain or signals.pre_save.has_listeners(model) or signals.post_save.has_listeners(model)
                or any(hasattr(v, "resolve_expression") for v in values.values())):
            return PendingRow(obj, self.alias)  # create()'s way: obj.save(force_insert=True)
        obj._prepare_related_fields_for_save(operation_name="save")
        meta = model._meta
        if obj.pk is None and meta.pk.has_default():
            obj.pk = meta.pk.get_pk_value_on_save(obj)
        connection = connections[self.alias]
        key = obj.pk is not None
        compiled = self._compiled.setdefault(connection, {})
        insert = compiled.get(key)
        if insert is None:
            insert = compiled[key] = _Insert(obj, connection)
        params = insert.params(obj) if insert.fixed else None
        # params None: this row's SQL would differ from the compiled one (create()'s way).
        return PendingRow(obj, self.alias, insert, params, connection) if params is not None else \
            PendingRow(obj, self.alias)


class PendingRow:
    """A row :meth:`PreparedInsert.prepare` made; ``run()`` inserts it and returns the instance."""

    __slots__ = ("obj", "alias", "insert", "params", "connection")

    def __init__(self, obj, alias: str, insert: _Insert | None = None, params: list | None = None,
                 connection=None) -> None:
        self.obj, self.alias, self.insert, self.params, self.connection = obj, alias, insert, params, connection

    def run(self):
        from django.db import transaction

        obj = self.obj
        if self.insert is None or connections[self.alias] is not self.connection:
            obj.save(force_insert=True, using=self.alias)  # what create() does
            return obj
        with transaction.mark_for_rollback_on_error(self.alias):
            self.insert.run(obj, self.params, self.connection)
        obj._state.db = self.alias
        obj._state.adding = False
        return obj


def rows_insert(rows: Sequence[PendingRow], *, lock: PreparedRead | None = None,
                lock_values: dict[str, Any] | None = None) -> None:
    """Insert ``rows`` (made by :meth:`PreparedInsert.prepare`, on one database) and run ``lock``,
    a :class:`PreparedRead` that locks rows (``select_for_update``), with ``lock_values``; inside
    the caller's transaction. Each row is then saved, as its ``run()`` leaves it.

    On PostgreSQL, when every row was prepared on this connection, it is one statement, one
    round trip: each INSERT a data-modifying ``WITH`` query, the lock one more, and a ``SELECT``
    that reads them in order (:func:`_together_sql`) — instead of one round trip each, every one
    a wake-up of the server's backend and of the caller's thread (docs/performance.md, item 25).
    One statement has one snapshot, taken before any wait for the lock: whoever reads under the
    lock reads in a *later* statement (a count under a row lock must see what the lock's previous
    holder committed). Foreign keys are checked at the statement's end, so a row may refer to
    one written beside it. Elsewhere (SQLite; a row ``create()``'s way) each statement is sent alone, in order.
    """
    alias = rows[0].alias
    connection = connections[alias]
    if lock is not None:
        lock.check(lock_values or {})
    if connection.vendor != "postgresql" or lock is not None and lock.alias != alias or any(
            row.alias != alias or row.insert is None or row.connection is not connection for row in rows):
        for row in rows:
            row.run()
        if lock is not None:
            lock(**lock_values)
        return
    read = lock.compiled(connection) if lock is not None else None
    inserts = tuple(row.insert for row in rows)
    known = _together.setdefault(connection, {})
    sql = known.get((inserts, read))
    if sql is None:
        sql = known[(inserts, read)] = _together_sql(inserts, read, connection)
    params = [value for row in rows for value in row.params]
    if read is not None:
        params += read.bound(lock_values)
    from django.db import transaction

    with transaction.mark_for_rollback_on_error(alias):
        with statement_cursor(connection) as cursor:
            cursor.execute(sql, params)
            returned = cursor.fetchone()
    position = 0
    for row, insert in zip(rows, inserts, strict=True):
        obj, count = row.obj, len(insert.returning)
        if count:
            values = [returned[position:position + count]]
            if insert.converters:
                values = list(insert.compiler.apply_converters(values, insert.converters))
            for value, field in zip(values[0], insert.returning, strict=True):
                setattr(obj, field.attname, value)
        position += count or 1  # a row with nothing to return is counted (_together_sql)
        obj._state.db = alias
        obj._state.adding = False


_together: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # connection → {(inserts, read): SQL}


def _together_sql(inserts: tuple[_Insert, ...], read: _Compiled | None, connection) -> str:
    """``WITH "inserted_0" AS (INSERT …), … "locked" AS (SELECT … FOR …) SELECT (SELECT … FROM
    "inserted_0"), …, (SELECT COUNT(*) FROM "locked")``.

    Every part is read by the final ``SELECT``, in the order given: PostgreSQL runs an uncorrelated
    sub-select when the select list first needs its value, left to right, so the rows are written
    and the lock taken in the order of separate statements (a part nobody reads would run at the
    statement's end, and a plain ``WITH`` query not at all). The order matters for waits: two
    submits racing with one Idempotency-Key each write the key (a unique index) before they lock
    the user's row, as they always did; one writing it after the lock could deadlock with the other.
    """
    quote = connection.ops.quote_name
    queries, returned = [], []
    for n, insert in enumerate(inserts):
        name = quote(f"inserted_{n}")
        if insert.returning:
            queries.append(f"{name} AS ({insert.sql})")
            returned += [f"(SELECT {quote(field.column)} FROM {name})" for field in insert.returning]
        else:
            queries.append(f"{name} AS ({insert.sql} RETURNING 1)")
            returned.append(f"(SELECT COUNT(*) FROM {name})")
    if read is not None:
        queries.append(f"{quote('locked')} AS ({read.sql})")
        returned.append(f"(SELECT COUNT(*) FROM {quote('locked')})")
    return f"WITH {', '.join(queries)} SELECT {', '.join(returned)}"


class _Insert:
    def __init__(self, obj, connection) -> None:
        from django.db.models.sql import InsertQuery

        meta = obj._meta
        self.fields = [f for f in meta.local_concrete_fields
                       if not f.generated and (obj.pk is not None or f is not meta.auto_field)]
        # A field with its own placeholder may write different SQL for another value.
        self.fixed = not any(hasattr(f, "get_placeholder") for f in self.fields)
        query = InsertQuery(type(obj))
        query.insert_values(self.fields, [obj])
        self.compiler = compiler = query.get_compiler(connection=connection)
        self.plan = [(f, value_preparer(f, connection, lambda value, f=f: compiler.prepare_value(f, value)))
                     for f in self.fields]
        # What ``params`` runs per row, worked out here once: every field's attribute read in one
        # ``attrgetter`` call (``Field.pre_save`` is that read; a field with a ``pre_save`` of its
        # own, as an ``auto_now`` stamp, is asked after), and a value the field sends unchanged
        # kept without calling its preparer (value_preparer's first test, taken inline).
        read = operator.attrgetter(*[f.attname for f in self.fields]) if self.fields else None
        self.read = read if len(self.fields) > 1 else lambda obj: (read(obj),) if read else ()
        self.pre_saving = [(n, f) for n, f in enumerate(self.fields) if type(f).pre_save is not Field.pre_save]
        self.steps = [(_passthrough(f, connection), prepare) for f, prepare in self.plan]
        self.returning = meta.db_returning_fields
        compiler.returning_fields = self.returning
        (self.sql, _params), = compiler.as_sql()
        self.fixed = self.fixed and self.params(obj) is not None
        self.cols = [f.get_col(meta.db_table) for f in self.returning]
        self.converters = compiler.get_converters(self.cols)

    def params(self, obj) -> list | None:
        """The row's values as the compiler sends them; None when one is an expression (its own SQL).

        A value the field would send unchanged (see :func:`_passthrough`) is taken as it is;
        every other goes through the compiler's ``prepare_value`` (``get_db_prep_save``)."""
        values = self.read(obj)
        if self.pre_saving:
            values = list(values)
            for n, field in self.pre_saving:  # what compiler.pre_save_val does (an insert is never raw)
                values[n] = field.pre_save(obj, True)
        params = [value if type(value) in same or value is None and same else prepare(value)
                  for value, (same, prepare) in zip(values, self.steps, strict=True)]
        return None if any(hasattr(p, "as_sql") for p in params) else params

    def run(self, obj, params: list, connection) -> None:
        compiler = self.compiler
        with statement_cursor(connection) as cursor:
            cursor.execute(self.sql, params)
            if not self.returning:
                return
            if connection.features.can_return_columns_from_insert:
                rows = [connection.ops.fetch_returned_insert_columns(cursor, compiler.returning_params)]
            else:
                rows = [(connection.ops.last_insert_id(cursor, obj._meta.db_table, self.returning[0].column),)]
        if self.converters:
            rows = list(compiler.apply_converters(rows, self.converters))
        for value, field in zip(rows[0], self.returning, strict=True):
            setattr(obj, field.attname, value)


def binds_on_server(connection) -> bool:
    """Whether :func:`statement_cursor` binds on the server (and so prepares) on ``connection``."""
    return connection.vendor == "postgresql" and connection.settings_dict["OPTIONS"].get("prepare_threshold") is not None


def statement_cursor(connection):
    """A cursor for a hot statement: ``connection.cursor()``, except on PostgreSQL with
    prepared statements on (OPTIONS ``prepare_threshold`` not None: yoloportal/env.py), where
    it binds the parameters on the server (Django's ``server_side_binding`` cursor) instead of
    quoting them into the SQL, so each statement is the same text every run and psycopg
    prepares it on this connection once it has run ``prepare_threshold`` times.

    Only for SQL whose every parameter the server can type (values compared with or stored
    in a column, ``LIMIT``): the ORM's SQL for a filter or an insert is; a parameter in a
    select list or a ``GROUP BY`` may not be (Django ticket #20516), which is why the rest of
    the project keeps client-side binding. It is the same Django cursor otherwise (errors
    translated, execute wrappers and query logging apply): what ``connection.cursor()``
    does (``BaseDatabaseWrapper._cursor``), with another psycopg cursor class."""
    if not binds_on_server(connection):
        return connection.cursor()
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    with connection.wrap_database_errors:
        return connection._prepare_cursor(_server_binding_cursor_class()(connection.connection))


@functools.lru_cache(maxsize=256)
def numbered_placeholders(sql: str) -> str:
    """``sql`` with Django's ``%s`` placeholders as PostgreSQL's own ``$1``, ``$2`` … (``%%`` as
    ``%``): the text psycopg would send for it, made once per statement instead of at every run.

    psycopg converts a query's ``%s`` at each ``execute`` and caches the result only for a query
    of at most 50 parameters and 4,096 bytes; the job's INSERT has more, so its ~1 KB of SQL was
    split by a regular expression on every submit (~0.1–0.2 ms of the web process's CPU). The
    few statements of this module are a fixed set per process, hence the bounded cache here.
    A ``%`` in any other use (``%(name)s``, a stray one) is refused: it is no statement of ours."""
    pieces = re.split(r"(%%|%s)", sql)
    number = 0
    for n, piece in enumerate(pieces):
        if piece == "%s":
            number += 1
            pieces[n] = f"${number}"
        elif piece == "%%":
            pieces[n] = "%"
        elif "%" in piece:
            raise ValueError(f"only %s placeholders (and %% for a percent sign) are supported: {sql}")
    return "".join(pieces)


@functools.cache
def _server_binding_cursor_class() -> type:
    from django.db.backends.postgresql.base import CursorMixin
    from psycopg import RawCursor

    class StatementCursor(CursorMixin, RawCursor):
        """Django's server-binding cursor (``ServerBindingCursor``: psycopg's ``Cursor`` and
        Django's ``CursorMixin``), as a psycopg ``RawCursor``, which sends ``$n`` placeholders as
        they are: :func:`numbered_placeholders` writes them once per statement. Same statement
        text on the server as before, so the same prepared statements."""

        def execute(self, query, params=None, **kwargs):
            return super().execute(numbered_placeholders(query) if params is not None else query, params, **kwargs)

        def executemany(self, query, params_seq, **kwargs):
            return super().executemany(numbered_placeholders(query), params_seq, **kwargs)

        def _send_query_prepared(self, *args, **kwargs):
            # Django's query log (DEBUG, CaptureQueriesContext) reads the statement from
            # ``cursor._query``, which psycopg 3.3 sets only when it sends a statement unprepared:
            # a prepared run was logged as None. tests/jobs/test_submit_cost.py reads the log.
            # psycopg's private method (name, pgq, *, binary): whatever its signature becomes,
            # the call passes through unchanged; only the log would lose the text again.
            pgq = kwargs.get("pgq", args[1] if len(args) > 1 else None)
            if hasattr(pgq, "query"):
                self._query = pgq
            return super()._send_query_prepared(*args, **kwargs)

    return StatementCursor


def value_preparer(field, connection, fallback: Callable[[Any], Any] | None = None) -> Callable[[Any], Any]:
    """A function of a value that returns what ``field.get_db_prep_save(value, connection)``
    returns (``fallback``, when given, is what to call instead), without calling it for a
    value the field would send unchanged (:func:`_passthrough`) or for a datetime in UTC on
    SQLite (:func:`_utc_text`): most of the CPU of writing many rows at once is the fields'
    conversions (services.job_queue_info_set: two thirds of rewriting 10,000 queue rows)."""
    same, utc_text = _passthrough(field, connection), _utc_text(field, connection)
    fallback = fallback or (lambda value: field.get_db_prep_save(value, connection))

    def prepare(value: Any) -> Any:
        if same and (value is None or type(value) in same):
            return value
        if utc_text and type(value) is datetime and value.tzinfo is UTC:
            return str(value.replace(tzinfo=None))  # see _utc_text
        return fallback(value)

    return prepare


def _utc_text(field, connection) -> bool:
    """True when ``field`` is a plain ``DateTimeField`` on SQLite whose connection works in UTC
    (USE_TZ, no database TIME_ZONE): an aware datetime *in UTC* (what ``timezone.now()``
    returns) is then sent as ``str()`` of it made naive — exactly what ``get_db_prep_save``
    returns (``get_prep_value`` keeps an aware datetime; SQLite's ``adapt_datetimefield_value``
    is ``str(make_naive(value, UTC))``, and converting a UTC time to UTC changes nothing), without
    the timezone machinery (~3 % of a submit's CPU in the web process: a job has several such
    stamps). Any other value (naive, another zone, a subclass) goes through the compiler.
    tests/core/test_prepared.py compares with the compiler's."""
    from django.db import models

    if type(field) is not models.DateTimeField or connection.vendor != "sqlite":
        return False
    # Imported only for SQLite (loaded already then; importing it beside another backend is circular).
    from django.db.backends.sqlite3.operations import DatabaseOperations

    return (type(connection.ops).adapt_datetimefield_value is DatabaseOperations.adapt_datetimefield_value
            and connection.timezone is UTC)


def _passthrough(field, connection) -> tuple[type, ...]:
    """The exact value types that ``field.get_db_prep_save`` returns unchanged on ``connection``
    (None included whenever this is not empty); () when unsure — a subclass, a JSON field, a
    database whose driver wants its integers wrapped (psycopg's Int4 ...). Django 5.2's fields:
    CharField/TextField ``to_python`` returns a str as it is; IntegerField ``int(v)``, FloatField
    ``float(v)`` and BooleanField ``bool(v)`` of a value of that very type are the value, and
    the integer adaptation is the base one (returns it) unless the database's ops override it;
    None stays None for each of these and for dates, UUIDs and foreign keys; a foreign key to an
    integer key sends an int as it is (the target's conversion, above). tests/core/
    test_prepared.py compares the result with the compiler's for every field of a job."""
    from django.db import models
    from django.db.backends.base.operations import BaseDatabaseOperations

    kind = type(field)
    integers = (models.IntegerField, models.BigIntegerField, models.SmallIntegerField, models.PositiveIntegerField,
                models.PositiveBigIntegerField, models.PositiveSmallIntegerField)
    ops = type(connection.ops)
    plain = ops.adapt_integerfield_value is BaseDatabaseOperations.adapt_integerfield_value
    if kind in (models.CharField, models.TextField):
        return (str,)
    if kind in integers:
        return (int,) if plain else (type(None),)
    if kind is models.ForeignKey and plain:
        # The target's conversion of an int: an integer field's int(v), or an auto field's int(v)
        # through ``validate_autopk_value``, which returns it unless the database's ops override it.
        target = type(field.target_field)
        autos = (models.AutoField, models.BigAutoField, models.SmallAutoField)
        if target in integers or target in autos and (
                ops.validate_autopk_value is BaseDatabaseOperations.validate_autopk_value):
            return (type(None), int)
    if kind is models.FloatField:
        return (float,)
    if kind is models.BooleanField:
        return (bool,)
    if kind in (models.DateTimeField, models.DateField, models.UUIDField, models.ForeignKey):
        return (type(None),)
    return ()
