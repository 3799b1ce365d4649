"""The hot queries use an index with 100,000 jobs in the database (EXPLAIN, on SQLite and PostgreSQL).

Hot: the queue in the order the scheduler considers it, a team's (and a user's) jobs newest
first, the scheduler's queued and running jobs, its newest succeeded jobs and arrivals, and
a job's events/logs/metrics after a seq.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.db.models import Q
from django.test.utils import CaptureQueriesContext

from apps.accounts.services import membership_set, team_ensure
from apps.core.pagination import NewestFirstPage
from apps.jobs.models import ACTIVE_STATES, HOLDING_STATES, Job, JobEvent, JobState, LogChunk, MetricPoint
from apps.jobs.selectors import job_list, queue_list
from tests.jobs.bulk import insert_job_history, insert_jobs

# The marker makes pytest-django create the test database; the rows are made once per module.
pytestmark = pytest.mark.django_db

JOBS = 100_000
# The most rows a page may sort on PostgreSQL: twice a user's share here (100k jobs over 100
# users, exactly 1,000 each), below a team's (5,000). At 1,000 it failed a CI run: the
# planner's estimate of a user's matches comes from ANALYZE's random sample (1,033 once).
SMALL_SORT = 2000
TABLES = ("jobs_job", "jobs_jobevent", "jobs_logchunk", "jobs_metricpoint")


@pytest.fixture(scope="module")
def big(django_db_setup, django_db_blocker):
    """20 teams of 5 users, 100k jobs, 100 history rows for each of the 200 newest jobs.

    Made once for the module inside a transaction that is rolled back afterwards (each
    test runs in a savepoint within it): dropping 100k rows by DELETE takes longer than
    making them.
    """
    with django_db_blocker.unblock(), transaction.atomic():
        owners = []
        for t in range(20):
            team = team_ensure(slug=f"team-{t}")
            for u in range(5):
                # No password: hashing 100 of them would take longer than the 100k jobs.
                user = get_user_model().objects.create(username=f"u{t}-{u}", password="!")
                membership_set(user=user, team=team, role="member")
                owners.append((team, user))
        insert_jobs(JOBS, owners=owners)
        insert_job_history(jobs=200, rows_per_job=100)
        yield {"member": owners[0][1], "job": Job.objects.order_by("-created_at").first()}
        transaction.set_rollback(True)


def plan_of(queryset) -> str:
    return queryset.explain()


NEWEST = NewestFirstPage.ordering  # what jobs/ pages by: newest first, ties by id


def assert_indexed(plan: str, *, paged: bool) -> None:
    """No full scan of a hot table: each touch goes through an index. A page (LIMIT) must
    also come out of the index in order (SQLite), or sort at most a small match (PostgreSQL)."""
    if connection.vendor == "postgresql":
        for table in TABLES:
            assert f"Seq Scan on {table}" not in plan, plan
        assert "Index" in plan, plan
        if paged:
            # PostgreSQL rightly sorts a small match (a few hundred rows) instead of walking an
            # index in order; it must never sort thousands to hand out one page. An Incremental
            # Sort over an index's order (jobs/ pages by created_at, ties by id) sorts only the
            # rows of one time stamp at a time and stops with the page: not a sort of the match.
            sorted_rows = [int(n) for n in re.findall(r"(?<!Incremental )Sort\s+\(cost=[\d.]+\.\.[\d.]+ rows=(\d+)", plan)]
            assert all(n <= SMALL_SORT for n in sorted_rows), plan
    else:
        for line in plan.splitlines():
            if any(re.search(rf"\b{table}\b", line) for table in TABLES):
                assert re.search(r"\b(SEARCH|SCAN)\b.*\bUSING (COVERING )?INDEX\b|USING INTEGER PRIMARY KEY", line), plan
        if paged:
            assert "USE TEMP B-TREE FOR ORDER BY" not in plan, plan


def hot_queries(member, job) -> dict[str, object]:
    return {
        "queue in scheduler order": queue_list(user=member)[:100],
        "team jobs newest first": job_list(user=member).order_by(*NEWEST)[:100],
        "my jobs newest first": job_list(user=member, mine=True).order_by(*NEWEST)[:100],
        "team jobs in one state": job_list(user=member, state=JobState.FAILED).order_by(*NEWEST)[:100],
        "team jobs after a next link's job": job_list(user=member).order_by(*NEWEST).filter(
            Q(created_at__lt=job.created_at) | Q(created_at=job.created_at, pk__lt=job.pk))[:101],
        "submit: a user's active jobs": Job.objects.filter(user=member, state__in=ACTIVE_STATES).values("pk"),
        "scheduler: queued jobs": Job.objects.filter(state=JobState.QUEUED),
        "scheduler: holding jobs": Job.objects.filter(state__in=HOLDING_STATES, node__isnull=False),
        "scheduler: runtime model's samples": Job.objects.filter(state=JobState.SUCCEEDED).order_by("-finished_at")[:500],
        "scheduler: recent arrivals": Job.objects.filter(created_at__gte=job.created_at - timedelta(days=1))
                                      .order_by("-created_at")[:500],
        "events after seq": JobEvent.objects.filter(job=job, seq__gt=50).order_by("seq")[:1000],
        "logs after seq": LogChunk.objects.filter(job=job, seq__gt=50).order_by("seq")[:500],
        "metrics after seq": MetricPoint.objects.filter(job=job, seq__gt=50).order_by("seq")[:1000],
    }


HOT = ["queue in scheduler order", "team jobs newest first", "my jobs newest first", "team jobs in one state",
       "team jobs after a next link's job",
       "submit: a user's active jobs", "scheduler: queued jobs", "scheduler: holding jobs",
       "scheduler: runtime model's samples", "scheduler: recent arrivals", "events after seq",
       "logs after seq", "metrics after seq"]


@pytest.mark.parametrize("name", HOT)
def test_the_hot_query_uses_an_index_at_100k_jobs(big, name):
    assert Job.objects.count() == JOBS
    queryset = hot_queries(big["member"], big["job"])[name]
    assert_indexed(plan_of(queryset), paged=queryset.query.high_mark is not None)


@pytest.mark.parametrize("scope", ["team", "mine", "one state", "queue"])
def test_a_list_pages_count_reads_an_index_alone_at_100k_jobs(big, scope):
    """Every list page counts its rows (the pagination's total). On SQLite the count comes
    out of one index without reading the rows (a user with 5,000 jobs: 34 ms with the rows,
    under 1 ms without); on PostgreSQL it is at least not a scan of the table."""
    member = big["member"]
    queryset = {"team": job_list(user=member), "mine": job_list(user=member, mine=True),
                "one state": job_list(user=member, state=JobState.FAILED), "queue": queue_list(user=member)}[scope]
    with CaptureQueriesContext(connection) as captured:
        assert queryset.count() > 0
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + ("QUERY PLAN " if connection.vendor == "sqlite" else "") +
                       captured.captured_queries[-1]["sql"])
        plan = "\n".join(" ".join(str(c) for c in row) for row in cursor.fetchall())
    if connection.vendor == "sqlite":
        assert "COVERING INDEX" in plan, plan
    else:
        assert_indexed(plan, paged=False)


def test_my_jobs_page_reads_no_more_than_a_page_when_the_user_has_thousands_in_their_team(big):
    """``GET jobs/?mine=1`` filters team AND user, which go together (a user's jobs are in their
    team). PostgreSQL assumed them independent, expected a few hundred matches where there
    were thousands, and read and sorted them all for one page; the extended statistics on
    (user_id, team_id) (migration jobs 0018) tell it, once ANALYZE has run."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's planner estimates (SQLite walks the user's index: test above)")
    team = team_ensure(slug="busy-team")
    user = get_user_model().objects.create(username="busy", password="!")
    membership_set(user=user, team=team, role="member")
    insert_jobs(5000, owners=[(team, user)])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE jobs_job")
    queryset = job_list(user=user, mine=True).order_by("-created_at")[:100]
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
        plan = cursor.fetchone()[0]
    plan = plan[0]["Plan"] if isinstance(plan, list) else plan

    def sorted_inputs(node: dict) -> list[int]:
        own = [child["Actual Rows"] for child in node.get("Plans", [])] if node["Node Type"] == "Sort" else []
        return own + [n for child in node.get("Plans", []) for n in sorted_inputs(child)]

    assert all(rows <= SMALL_SORT for rows in sorted_inputs(plan)), plan


def generic_plan(run) -> str:
    """The plan PostgreSQL keeps for the statement that ``run()`` sends once it plans it for any
    parameters (a prepared statement's generic plan: apps/core/prepared.py prepares the submit's
    statements, and after five runs the server may plan them once for all values)."""
    sent = []

    def keep(execute, sql, params, many, context):
        sent.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(keep):
        run()
    [(sql, params)] = sent
    numbers = iter(range(1, len(params) + 1))
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute("PREPARE generic_check AS " + re.sub(r"%s", lambda _: f"${next(numbers)}", sql))
        try:
            cursor.execute("EXPLAIN EXECUTE generic_check(" + ", ".join(["%s"] * len(params)) + ")", params)
            return "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("DEALLOCATE generic_check")


@pytest.mark.parametrize("name", ["replay check", "active count"])
def test_the_submits_prepared_reads_use_an_index_when_planned_for_any_values(big, name):
    """Planned without the values, the replay check cannot use the partial unique index on
    (user, key) — ``key <> ''`` cannot be proven from ``NOT (key = $3)`` — unless the empty
    key is part of the statement's text."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's generic plans")
    from apps.jobs.services import KEY_USED, active_jobs_count

    member = big["member"]
    run = {"replay check": lambda: KEY_USED(user_id=member.pk, key="no-such-key"),
           "active count": lambda: active_jobs_count(member.pk, limit=1000)}[name]
    plan = generic_plan(run)
    assert_indexed(plan, paged=False)
    if name == "replay check":
        assert "one_job_per_idempotency_key" in plan, plan
