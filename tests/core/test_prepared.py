"""PreparedRead: hot reads compiled once per connection return what the ORM returns (apps/core/prepared.py)."""

from __future__ import annotations

import threading

import pytest
from django.db.models import Count

from apps.accounts.models import ApiToken, hash_token
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


def test_a_prepared_insert_sends_expressions_through_the_orm(bob, teams):
    from django.db.models import Value
    from django.db.models.functions import Upper

    from apps.core.prepared import PreparedInsert

    jobs = PreparedInsert(Job)
    job = jobs(task_name=Upper(Value("loud")), team=teams["vision"], user=bob, spec={}, spec_hash="h", timeout_s=60)
    assert row(Job, job.pk)["task_name"] == "LOUD"
