"""PreparedRead: hot reads compiled once per connection return what the ORM returns (apps/core/prepared.py)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest
from django.db.models import Count
from django.utils import timezone

from apps.accounts.models import ApiToken, Team, hash_token
from apps.accounts.services import token_create
from apps.core.prepared import PreparedRead
from apps.jobs.models import ACTIVE_STATES, Job, JobState
from tests.jobs.factories import make_job

pytestmark = pytest.mark.django_db

TOKEN = PreparedRead(lambda key_hash: ApiToken.objects.select_related("user").filter(key_hash=key_hash)[:1],
                     samples=({"key_hash": "0" * 64}, {"key_hash": "1" * 64}))
ACTIVE = PreparedRead(lambda user_id: Job.objects.filter(user_id=user_id, state__in=ACTIVE_STATES).values("user")
                      .annotate(n=Count("pk")).values_list("n", flat=True),
                      samples=({"user_id": 1}, {"user_id": 2}))


def test_model_rows_and_their_select_related_rows_are_the_orms(bob):
    _, key = token_create(user=bob, name="t")
    [token] = TOKEN(key_hash=hash_token(key))
    expected = ApiToken.objects.select_related("user").get(key_hash=hash_token(key))
    assert {f.attname: getattr(token, f.attname) for f in ApiToken._meta.concrete_fields} == \
        {f.attname: getattr(expected, f.attname) for f in ApiToken._meta.concrete_fields}
    assert token.created_at.tzinfo is not None  # the database's converters ran
    assert token.user.username == "bob" and token.user.pk == bob.pk  # no second query needed
    assert TOKEN(key_hash="f" * 64) == []


def test_values_are_substituted_each_call(bob, alice, teams):
    for state in (JobState.QUEUED, JobState.RUNNING, JobState.SUCCEEDED):
        make_job(team=teams["vision"], user=bob, state=state)
    assert ACTIVE(user_id=bob.pk) == [2]
    assert ACTIVE(user_id=alice.pk) == []
    assert Job.objects.filter(user=bob, state__in=ACTIVE_STATES).count() == 2


def test_each_threads_connection_gets_its_own_compiled_query(bob, teams):
    from django.db import connections

    make_job(team=teams["vision"], user=bob)
    assert ACTIVE(user_id=bob.pk) == [1]
    compiled_here = len(ACTIVE._compiled)

    def other_thread():
        try:
            ACTIVE(user_id=bob.pk)  # its own connection (which cannot see this test's uncommitted row)
            seen.append(len(ACTIVE._compiled))
        finally:
            connections.close_all()

    seen: list[int] = []
    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    assert seen == [compiled_here + 1]


def test_a_query_whose_sql_depends_on_its_values_is_refused():
    read = PreparedRead(lambda n: Job.objects.all()[:n], samples=({"n": 1}, {"n": 2}))
    with pytest.raises(ValueError, match="depends on its values"):
        read(n=3)


def test_a_value_that_does_not_reach_the_sql_is_refused():
    read = PreparedRead(lambda user_id: Job.objects.filter(user_id=7), samples=({"user_id": 1}, {"user_id": 2}))
    with pytest.raises(ValueError, match="does not reach the SQL"):
        read(user_id=3)


def test_values_of_another_type_are_refused():
    with pytest.raises(TypeError, match="user_id must be a int"):
        ACTIVE(user_id="1")
    with pytest.raises(TypeError, match="expected the values"):
        ACTIVE(user=1)


def row(model, pk) -> dict:
    obj = model.objects.get(pk=pk)
    return {f.attname: getattr(obj, f.attname) for f in model._meta.concrete_fields}


def test_a_prepared_insert_writes_the_row_create_writes(bob, teams):
    from apps.accounts.models import AuditEntry
    from apps.core.prepared import PreparedInsert
    from apps.jobs.models import JobEvent

    values = {"task_name": "t", "team": teams["vision"], "user": bob, "spec": {"a": [1, {"b": None}]},
              "spec_hash": "h", "gpus": 0.5, "reason": "r", "raw_spec": "x: 1", "timeout_s": 60}
    jobs = PreparedInsert(Job)
    first, second = jobs(**values), jobs(**{**values, "task_name": "u", "spec": {"c": "ü"}})  # compiled, reused
    expected = Job.objects.create(**values)
    for job, want in ((first, values), (second, {**values, "task_name": "u", "spec": {"c": "ü"}})):
        assert not job._state.adding and job._state.db == "default"
        stored, created = row(Job, job.pk), row(Job, expected.pk)
        differ = {k for k in stored if stored[k] != created[k]}
        assert differ <= {"id", "attempt_id", "created_at", "task_name", "spec"}, differ  # uuid defaults, clock
        assert (stored["task_name"], stored["spec"]) == (want["task_name"], want["spec"])
        assert stored["created_at"] == job.created_at  # auto_now_add set on the instance, as save() does

    events = PreparedInsert(JobEvent)
    one, two = events(job=first, seq=1, attempt=1, kind="submitted", message="m"), events(job=first, seq=2, attempt=1, kind="x")
    assert isinstance(one.pk, int) and two.pk == one.pk + 1  # the database's id, read back
    assert row(JobEvent, two.pk)["kind"] == "x"

    # A model with its own save() goes through create().
    audit = PreparedInsert(AuditEntry)
    assert not audit.plain
    entry = audit(actor=bob, actor_name="bob", action=AuditEntry.Action.JOB_SUBMIT, target_type="job",
                  target_id="1", message="m")
    assert AuditEntry.objects.filter(pk=entry.pk).exists()


def test_the_audit_entry_prepared_insert_writes_what_create_writes(bob, teams):
    """AuditEntry's own save() only refuses updates, so audit_record's insert skips it
    (save_guards_updates_only): the row must be the one create() writes, and the entry
    stays append-only afterwards."""

    from apps.accounts.models import AuditEntry
    from apps.accounts.services import AUDIT_INSERT, audit_record
    from apps.core.prepared import PreparedInsert

    assert AUDIT_INSERT.plain and not PreparedInsert(AuditEntry).plain
    values = {"actor": bob, "actor_name": "bob", "team_id": teams["vision"].pk, "action": "job.submit",
              "target_type": "job", "target_id": "x1", "message": "m", "data": {"k": ["ü", 1]}}
    prepared, expected = AUDIT_INSERT(**values), AuditEntry.objects.create(**values)
    assert isinstance(prepared.pk, int) and prepared.pk == expected.pk - 1
    stored, created = row(AuditEntry, prepared.pk), row(AuditEntry, expected.pk)
    assert {k for k in stored if stored[k] != created[k]} <= {"id", "created_at"}
    assert stored["created_at"] == prepared.created_at and prepared.created_at is not None
    entry = audit_record(actor=bob, action=AuditEntry.Action.TOKEN_CREATE, team=teams["vision"], target=bob,
                         message="x" * 600)
    again = AuditEntry.objects.get(pk=entry.pk)
    assert (again.actor_id, again.actor_name, again.team_id, again.action, again.target_type, again.target_id,
            len(again.message)) == (bob.pk, "bob", teams["vision"].pk, "token.create", "user", str(bob.pk), 500)
    with pytest.raises(PermissionError):
        entry.save()
    with pytest.raises(PermissionError):
        again.delete()


def test_a_prepared_insert_sends_expressions_through_the_orm(bob, teams):
    from django.db.models import Value
    from django.db.models.functions import Upper

    from apps.core.prepared import PreparedInsert

    jobs = PreparedInsert(Job)
    job = jobs(task_name=Upper(Value("loud")), team=teams["vision"], user=bob, spec={}, spec_hash="h", timeout_s=60)
    assert row(Job, job.pk)["task_name"] == "LOUD"


def test_a_prepared_insert_sends_each_value_as_the_compiler_would(bob, teams):
    """Values of a plain type are sent as they are (apps/core/prepared.py _passthrough): for
    every field of a job, its event and an audit entry, the same parameters as Django's
    compiler makes (``prepare_value(pre_save_val)``), on this database."""
    from django.db import connection

    from apps.accounts.models import AuditEntry
    from apps.core.prepared import PreparedInsert, _passthrough, _utc_text
    from apps.jobs.models import JobEvent

    job_values = {"task_name": "t-ü", "team": teams["vision"], "user": bob, "spec": {"a": [1, None]}, "spec_hash": "h",
                  "gpus": 0.5, "reason": "", "raw_spec": "x: 1", "timeout_s": 60, "retries_left": 2,
                  "idempotency_key": "k", "state": JobState.QUEUED, "queued_at": None, "cpu_milli": 0}
    cases = [(PreparedInsert(Job), job_values),
             (PreparedInsert(Job), {**job_values, "gpus": 1, "timeout_s": True, "reason": None and "", "cpu_milli": 3}),
             (PreparedInsert(JobEvent), {"job_id": None, "seq": 1, "attempt": 1, "kind": "submitted", "message": "m"}),
             (PreparedInsert(AuditEntry, save_guards_updates_only=True),
              {"actor": bob, "actor_name": "bob", "team_id": None, "action": "job.submit", "message": "", "data": {}}),
             # Set datetimes: UTC (SQLite's shortcut, apps/core/prepared.py _utc_text), another zone, naive.
             (PreparedInsert(Job), {**job_values, "queued_at": timezone.now(),
                                    "started_at": datetime(2026, 3, 29, 1, 30, 0, 5, tzinfo=UTC),
                                    "first_started_at": timezone.now().astimezone(ZoneInfo("Europe/Berlin")),
                                    "finished_at": datetime(2026, 12, 2, 2, 0, 0, 0, tzinfo=UTC)})]
    for prepared, values in cases:
        pending = prepared.prepare(**values)
        insert, obj = pending.insert, pending.obj
        assert insert is not None
        compiler = insert.compiler
        expected = [compiler.prepare_value(f, compiler.pre_save_val(f, obj)) for f in insert.fields]
        got = insert.params(obj)
        stamps = {i for i, f in enumerate(insert.fields) if getattr(f, "auto_now_add", False)}

        def plain(values: list, stamps: set = stamps) -> list:  # psycopg's Jsonb wrapper has no ==: compare what it wraps
            return [("jsonb", v.obj) if type(v).__name__ == "Jsonb" else v
                    for i, v in enumerate(values) if i not in stamps]

        assert plain(got) == plain(expected), connection.vendor
        assert [type(v) for v in got] == [type(v) for v in expected]
        assert any(_passthrough(f, connection) for f in insert.fields)  # the shortcut is taken for some fields
        if connection.vendor == "sqlite" and prepared.model is Job:  # and the UTC one for the job's stamps
            assert any(_utc_text(f, connection) for f in insert.fields)


def test_the_submit_s_job_insert_is_still_prepared_with_the_fence_s_database_default():
    """review25: 2786901 gave ``Job.resume_chosen_attempt`` a ``db_default`` (for the previous
    release's inserts during migrate), and PreparedInsert falls back to ``create()`` for any model
    with a field that has a database default: since then every submit's job INSERT takes
    ``create()``'s way again, silently (docs/performance.md item 9). Measured in-process on SQLite,
    2,000 inserts each way: 0.33-0.35 ms per insert through create() against 0.21 ms prepared, the
    same row (only id, attempt_id, created_at differ): ~0.13 ms per submit, more than the gc.freeze
    commit (2f5fdb5) saved. Failed before the lead fixed review25.
    Fix: fall back only for a field whose instance value would be the database's (``has_db_default()
    and not has_default()``: Model.__init__ then holds a DatabaseDefault); a field with a Python
    default as well is sent with that value by create() too."""
    from apps.jobs.services import EVENT_INSERT, JOB_INSERT

    assert EVENT_INSERT.plain
    assert JOB_INSERT.plain


def test_postgresql_prepares_the_hot_statements_unless_told_not_to():
    from yoloportal.env import parse_database_url

    url = "postgres://u:p@db:5432/portal"
    assert parse_database_url(url)["OPTIONS"]["prepare_threshold"] == 5
    assert parse_database_url(url, prepared_statements=False)["OPTIONS"]["prepare_threshold"] is None
    assert "prepare_threshold" not in parse_database_url("sqlite:////tmp/x.sqlite3")["OPTIONS"]


def test_a_database_url_query_is_refused_not_dropped():
    """``?sslmode=require`` was silently dropped (a plain connection for an operator who asked for
    TLS): it is refused naming the parameters, never the password, and pointing at PGSSLMODE."""
    from yoloportal.env import EnvError, parse_database_url

    with pytest.raises(EnvError) as refused:
        parse_database_url("postgres://u:s3cret@db:5432/portal?sslmode=require&connect_timeout=5")
    assert "connect_timeout, sslmode" in str(refused.value) and "PGSSLMODE" in str(refused.value)
    assert "s3cret" not in str(refused.value)
    with pytest.raises(EnvError):
        parse_database_url("sqlite:////tmp/x.sqlite3?mode=ro")
    assert parse_database_url("postgres://u:p@db:5432/portal")["NAME"] == "portal"


def prepared_statements() -> list[str]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [statement for (statement,) in cursor.fetchall()]


@pytest.fixture
def postgresql():
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("prepared statements are PostgreSQL's")
    return connection


def test_a_prepared_read_is_prepared_on_the_server_after_a_few_runs(postgresql, bob):
    """The submit's statements are parsed and planned once per connection, not per run."""
    threshold = postgresql.settings_dict["OPTIONS"]["prepare_threshold"]
    for _ in range(threshold + 1):
        assert TOKEN(key_hash="f" * 64) == []
    [statement] = [s for s in prepared_statements() if '"accounts_apitoken"."key_hash" = $1' in s]
    assert TOKEN(key_hash="f" * 64) == []  # and runs prepared


def test_other_queries_keep_client_side_binding(postgresql, bob):
    """Only this module's statements bind on the server; an ORM query is never prepared."""
    for _ in range(10):
        list(ApiToken.objects.filter(key_hash="e" * 64))
    assert not [s for s in prepared_statements() if "accounts_apitoken" in s]


def test_nothing_is_prepared_when_prepared_statements_are_off(postgresql, bob, monkeypatch):
    """DATABASE_PREPARED_STATEMENTS=false (a pooler that cannot keep them): the client cursor."""
    monkeypatch.setitem(postgresql.settings_dict["OPTIONS"], "prepare_threshold", None)
    for _ in range(10):
        assert TOKEN(key_hash="d" * 64) == []
    assert not [s for s in prepared_statements() if "accounts_apitoken" in s]


def test_numbered_placeholders_are_what_psycopg_would_send():
    """The statement cursor sends ``$n`` as they are (a psycopg RawCursor): written once per
    statement, the same text psycopg's own conversion makes."""
    from apps.core.prepared import numbered_placeholders

    assert numbered_placeholders('SELECT 1 FROM "t" WHERE "a" = %s AND "b" LIKE \'x%%\' AND "c" IN (%s, %s)') == (
        'SELECT 1 FROM "t" WHERE "a" = $1 AND "b" LIKE \'x%\' AND "c" IN ($2, $3)')
    with pytest.raises(ValueError):
        numbered_placeholders('SELECT %(name)s')
    with pytest.raises(ValueError):
        numbered_placeholders("SELECT 5 % 2 = %s")


def submit_rows(bob, team, name: str, key: str = ""):
    """A job, its first event and its audit entry, made as job_submit makes them."""
    from apps.accounts.models import AuditEntry
    from apps.accounts.services import audit_prepare
    from apps.jobs.services import EVENT_INSERT, JOB_INSERT

    job = JOB_INSERT.prepare(task_name=name, team=team, user=bob, spec={"a": [1]}, spec_hash="h", gpus=1.0,
                             timeout_s=3600, seq=1, idempotency_key=key)
    event = EVENT_INSERT.prepare(job=job.obj, seq=1, attempt=1, kind="submitted", message=f"submitted {name}")
    audit = audit_prepare(actor=bob, action=AuditEntry.Action.JOB_SUBMIT, team=team.pk, target=job.obj,
                          message=name, data={"priority": "low"})
    return job, event, audit


def test_rows_inserted_together_are_the_rows_each_run_writes(bob, teams):
    """rows_insert writes what run() writes, row by row, reads back the auto keys, and leaves the
    instances saved; on PostgreSQL in one statement with the lock, elsewhere one statement each."""
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    from apps.accounts.models import AuditEntry
    from apps.core.prepared import rows_insert
    from apps.jobs.models import JobEvent
    from apps.jobs.services import USER_LOCK

    lock = USER_LOCK if connection.features.has_select_for_update else None
    for n in range(7):  # past psycopg's prepare_threshold: the prepared statement is run too
        alone = submit_rows(bob, teams["vision"], f"alone-{n}")
        for pending in alone:
            pending.run()
        together = submit_rows(bob, teams["vision"], f"together-{n}")
        with transaction.atomic(), CaptureQueriesContext(connection) as captured:
            rows_insert(together, lock=lock, lock_values={"user_id": bob.pk})
        sent = [q["sql"] for q in captured.captured_queries if "SAVEPOINT" not in q["sql"]]
        assert len(sent) == (1 if connection.vendor == "postgresql" else 3), sent
        for model, first, second in zip((Job, JobEvent, AuditEntry), alone, together, strict=True):
            assert not second.obj._state.adding and second.obj._state.db == "default"
            assert isinstance(second.obj.pk, int) or model is Job
            stored, expected = row(model, second.obj.pk), row(model, first.obj.pk)
            differ = {k for k in stored if stored[k] != expected[k]}
            assert differ <= {"id", "attempt_id", "created_at", "task_name", "job_id", "message", "target_id"}, differ
            assert stored["id"] == second.obj.pk
    assert JobEvent.objects.get(pk=together[1].obj.pk).job_id == together[0].obj.pk
    assert AuditEntry.objects.get(pk=together[2].obj.pk).target_id == str(together[0].obj.pk)


@pytest.mark.django_db(transaction=True)
def test_rows_inserted_together_hold_the_lock_until_the_transaction_ends(bob, teams):
    """The lock read runs in the same statement as the inserts (PostgreSQL): another connection
    cannot take the user's row until the inserting transaction ends."""
    from django.db import OperationalError, connection, connections, transaction

    from apps.core.prepared import rows_insert
    from apps.jobs.services import USER_LOCK

    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's (SQLite's IMMEDIATE transaction holds the database)")
    results = []

    def try_lock() -> None:
        other = connections.create_connection("default")
        try:
            with other.cursor() as cursor:
                cursor.execute("BEGIN")
                try:
                    cursor.execute('SELECT 1 FROM "auth_user" WHERE "id" = %s FOR NO KEY UPDATE NOWAIT', [bob.pk])
                    results.append("locked")
                except OperationalError:
                    results.append("held by the other")
                cursor.execute("ROLLBACK")
        finally:
            other.close()

    with transaction.atomic():
        rows_insert(submit_rows(bob, teams["vision"], "held"), lock=USER_LOCK, lock_values={"user_id": bob.pk})
        thread = threading.Thread(target=try_lock)
        thread.start()
        thread.join(30)
    try_lock()
    assert results == ["held by the other", "locked"]
    assert Job.objects.filter(task_name="held").count() == 1


@pytest.mark.django_db(transaction=True)
def test_rows_inserted_together_write_the_job_before_they_wait_for_the_lock(bob, teams):
    """The job's row (its Idempotency-Key, a unique index) is written before the statement waits
    for the user's lock, as when they were separate statements: two submits racing with one key
    then wait for each other in one order only (one taking the lock first could deadlock)."""
    import time

    from django.db import OperationalError, connection, connections, transaction

    from apps.core.prepared import rows_insert
    from apps.jobs.services import USER_LOCK

    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's")
    holder = connections.create_connection("default")
    holder.ensure_connection()
    holder.connection.autocommit = False
    holder.connection.execute('SELECT 1 FROM "auth_user" WHERE "id" = %s FOR NO KEY UPDATE', [bob.pk])
    pid, outcome = [], []

    def submit() -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                pid.append(cursor.fetchone()[0])
            with transaction.atomic():
                rows_insert(submit_rows(bob, teams["vision"], "waits", key="k-1"), lock=USER_LOCK,
                            lock_values={"user_id": bob.pk})
            outcome.append("inserted")
        finally:
            connection.close()

    thread = threading.Thread(target=submit)
    thread.start()
    try:
        waiting = False
        for _ in range(200):
            with connection.cursor() as cursor:
                cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", pid[:1] or [0])
                waiting = cursor.fetchone() == ("Lock",)
            if waiting:
                break
            time.sleep(0.05)
        assert waiting, "the inserting statement never waited for the user's lock"
        # A job with the same key waits for the waiting statement's uncommitted one: it is written.
        with pytest.raises(OperationalError, match="lock timeout"), transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '300ms'")
            submit_rows(bob, teams["vision"], "same key", key="k-1")[0].run()
    finally:
        holder.connection.rollback()
        holder.close()
        thread.join(30)
    assert outcome == ["inserted"]
    assert list(Job.objects.filter(idempotency_key="k-1").values_list("task_name", flat=True)) == ["waits"]


def test_rows_inserted_together_with_prepared_statements_off(postgresql, bob, teams, monkeypatch):
    """DATABASE_PREPARED_STATEMENTS=false: the one statement is sent with client-side binding."""
    from apps.core.prepared import rows_insert
    from apps.jobs.services import USER_LOCK

    monkeypatch.setitem(postgresql.settings_dict["OPTIONS"], "prepare_threshold", None)
    rows = submit_rows(bob, teams["vision"], "client-side")
    rows_insert(rows, lock=USER_LOCK, lock_values={"user_id": bob.pk})
    assert Job.objects.get(pk=rows[0].obj.pk).task_name == "client-side"
    assert not [s for s in prepared_statements() if "inserted_0" in s]


TEAMS = PreparedRead(lambda user_id: Team.objects.filter(memberships__user_id=user_id).order_by("-slug").distinct(),
                     samples=({"user_id": 1}, {"user_id": 2}))
JOB_STATES = PreparedRead(lambda user_id: Job.objects.filter(user_id=user_id).order_by("task_name")
                          .values_list("task_name", "state"), samples=({"user_id": 1}, {"user_id": 2}))


def fields(obj) -> dict:
    return {f.attname: getattr(obj, f.attname) for f in type(obj)._meta.concrete_fields}


def test_reads_ahead_answer_what_each_read_returns(bob, alice, teams):
    """Model rows with their select_related rows, values_list rows in the read's own order,
    a read that finds nothing; each answered from one statement on PostgreSQL, none on SQLite."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from apps.core.prepared import reads_ahead

    _, key = token_create(user=bob, name="t")
    for name in ("c", "a", "b"):
        make_job(team=teams["vision"], user=bob, task_name=name)
    calls = [(TOKEN, {"key_hash": hash_token(key)}), (TEAMS, {"user_id": bob.pk}), (JOB_STATES, {"user_id": bob.pk}),
             (TOKEN, {"key_hash": "f" * 64})]
    expected = [read(**values) for read, values in calls]
    assert [t.slug for t in expected[1]] == sorted((t.slug for t in expected[1]), reverse=True)
    assert [name for name, _ in expected[2]] == ["a", "b", "c"]
    with CaptureQueriesContext(connection) as ahead, reads_ahead(calls):
        with CaptureQueriesContext(connection) as asked:
            answers = [read(**values) for read, values in calls]
    assert len(ahead) - len(asked) == (1 if connection.vendor == "postgresql" else 0)
    assert len(asked) == (0 if connection.vendor == "postgresql" else len(calls))
    [token], [expected_token] = answers[0], expected[0]
    assert fields(token) == fields(expected_token) and fields(token.user) == fields(expected_token.user)
    assert [fields(t) for t in answers[1]] == [fields(t) for t in expected[1]]
    assert answers[2] == expected[2] and answers[3] == []


def test_a_read_ahead_answers_once_and_only_its_own_values_within_the_block(bob, alice, teams):
    """A second call, a call with other values and a call after the block run as usual."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from apps.core.prepared import reads_ahead

    make_job(team=teams["vision"], user=bob, task_name="x")
    with reads_ahead([(TEAMS, {"user_id": bob.pk}), (JOB_STATES, {"user_id": bob.pk})]):
        assert JOB_STATES(user_id=bob.pk) == [("x", JobState.QUEUED)]
        make_job(team=teams["vision"], user=bob, task_name="y")
        with CaptureQueriesContext(connection) as asked:
            assert JOB_STATES(user_id=bob.pk) == [("x", JobState.QUEUED), ("y", JobState.QUEUED)]
            assert JOB_STATES(user_id=alice.pk) == []
        assert len(asked) == 2
    expected = [t.slug for t in Team.objects.filter(memberships__user=bob).order_by("-slug")]
    with CaptureQueriesContext(connection) as after:
        assert [t.slug for t in TEAMS(user_id=bob.pk)] == expected
    assert len(after) == 1  # never asked within the block: forgotten at its end


def test_a_block_inside_another_reads_only_what_the_outer_one_did_not(bob, alice, teams):
    """Each read gets its own answer when one of the inner block's calls is the outer block's."""
    from apps.core.prepared import reads_ahead

    make_job(team=teams["vision"], user=alice, task_name="alices")
    bobs_teams = [t.pk for t in TEAMS(user_id=bob.pk)]
    with reads_ahead([(TEAMS, {"user_id": bob.pk}), (JOB_STATES, {"user_id": bob.pk})]):
        with reads_ahead([(TEAMS, {"user_id": bob.pk}), (JOB_STATES, {"user_id": alice.pk}),
                          (TOKEN, {"key_hash": "f" * 64})]):
            assert JOB_STATES(user_id=alice.pk) == [("alices", JobState.QUEUED)]
            assert TOKEN(key_hash="f" * 64) == []
            assert [t.pk for t in TEAMS(user_id=bob.pk)] == bobs_teams
        assert JOB_STATES(user_id=bob.pk) == []


def test_reads_ahead_with_prepared_statements_off(postgresql, bob, teams, monkeypatch):
    """DATABASE_PREPARED_STATEMENTS=false: the one statement is sent with client-side binding."""
    from apps.core.prepared import reads_ahead

    monkeypatch.setitem(postgresql.settings_dict["OPTIONS"], "prepare_threshold", None)
    make_job(team=teams["vision"], user=bob, task_name="client-side")
    expected = JOB_STATES(user_id=bob.pk), [t.pk for t in TEAMS(user_id=bob.pk)]
    with reads_ahead([(JOB_STATES, {"user_id": bob.pk}), (TEAMS, {"user_id": bob.pk})]):
        assert (JOB_STATES(user_id=bob.pk), [t.pk for t in TEAMS(user_id=bob.pk)]) == expected
    assert not [s for s in prepared_statements() if '"ahead_row"' in s]


def test_a_read_after_a_write_within_the_block_sees_the_write(bob, teams):
    """A write within the block forgets what was read ahead and not yet asked for: the read runs then."""
    from apps.core.prepared import reads_ahead

    make_job(team=teams["vision"], user=bob, task_name="x")
    bobs_teams = [t.pk for t in TEAMS(user_id=bob.pk)]
    with reads_ahead([(TEAMS, {"user_id": bob.pk}), (JOB_STATES, {"user_id": bob.pk})]):
        assert [t.pk for t in TEAMS(user_id=bob.pk)] == bobs_teams
        make_job(team=teams["vision"], user=bob, task_name="y")
        assert JOB_STATES(user_id=bob.pk) == [("x", JobState.QUEUED), ("y", JobState.QUEUED)]


def test_reads_ahead_still_answer_after_a_savepoint(postgresql, bob, teams):
    """A savepoint (a submit's atomic block) writes nothing: the answers stay, one statement in all."""
    from django.db import transaction
    from django.test.utils import CaptureQueriesContext

    from apps.core.prepared import reads_ahead

    with reads_ahead([(TEAMS, {"user_id": bob.pk}), (JOB_STATES, {"user_id": bob.pk})]):
        with CaptureQueriesContext(postgresql) as asked:
            with transaction.atomic():
                assert JOB_STATES(user_id=bob.pk) == []
                TEAMS(user_id=bob.pk)
    assert not [q for q in asked if "SAVEPOINT" not in q["sql"]]
