"""audit/ and notifications/deliveries/ page newest first, each page after the last item shown
(``?before=``, apps.core.pagination.NewestFirstPage; page 32): both logs only grow (an audit entry
for every manager action, a delivery for every job event a channel hears), so their first page and
a ``before`` page must come out of an index in order, not a sort of the whole log (EXPLAIN, on
SQLite and PostgreSQL, as tests/jobs/test_indexes.py does for jobs/)."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, transaction

from apps.accounts.models import AuditEntry
from apps.accounts.selectors import audit_list
from apps.accounts.services import membership_set, team_ensure
from apps.core.pagination import NewestFirstPage
from apps.notifications.models import Channel, Delivery
from apps.notifications.selectors import delivery_list

pytestmark = pytest.mark.django_db

ROWS = 50_000
TABLES = ("accounts_auditentry", "notifications_delivery")
SMALL_SORT = 2000  # PostgreSQL may sort a small match (a few thousand rows), never the log


@pytest.fixture(scope="module")
def logs(django_db_setup, django_db_blocker):
    """20 teams with a manager each, 50k audit entries over them, 100 channels with 500
    deliveries each; rolled back at the end (each test runs in a savepoint within it)."""
    with django_db_blocker.unblock(), transaction.atomic():
        managers, teams = [], []
        for t in range(20):
            team = team_ensure(slug=f"log-team-{t}")
            user = get_user_model().objects.create(username=f"m{t}", password="!")
            membership_set(user=user, team=team, role="manager")
            managers.append(user)
            teams.append(team)
        AuditEntry.objects.bulk_create(
            (
                AuditEntry(team=teams[n % 20], actor=managers[n % 20], action=AuditEntry.Action.CHANNEL_TEST)
                for n in range(ROWS)
            ),
            batch_size=5000,
        )
        channels = Channel.objects.bulk_create(
            Channel(user=managers[c % 20], name=f"hook-{c}", kind="webhook", target="https://hooks.example.com/x")
            for c in range(100)
        )
        Delivery.objects.bulk_create(
            (Delivery(channel=channels[n % 100], event="test", cause=f"c{n}") for n in range(ROWS)), batch_size=5000
        )
        admin = get_user_model().objects.create(username="log-admin", password="!", is_superuser=True)
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("ANALYZE accounts_auditentry; ANALYZE notifications_delivery")
            else:
                cursor.execute("ANALYZE")
        yield {"manager": managers[0], "admin": admin}
        transaction.set_rollback(True)


def assert_indexed(plan: str, *, in_order: bool = True) -> None:
    """No full scan of a log: each touch goes through an index. ``in_order``: the page also comes
    out of the index in order (SQLite), or sorts at most a small match (PostgreSQL); without it the
    caller's match (a manager's teams' entries, a user's channels' deliveries) may be sorted, as
    on main before page 32 (docs/performance.md, "Newest-first logs")."""
    if connection.vendor == "postgresql":
        for table in TABLES:
            assert f"Seq Scan on {table}" not in plan, plan
        sorted_rows = [int(n) for n in re.findall(r"(?<!Incremental )Sort\s+\(cost=[\d.]+\.\.[\d.]+ rows=(\d+)", plan)]
        assert not in_order or all(n <= SMALL_SORT for n in sorted_rows), plan
    else:
        for line in plan.splitlines():
            if any(re.search(rf"\b{table}\b", line) for table in TABLES):
                assert re.search(r"\b(SEARCH|SCAN)\b.*\bUSING (COVERING )?INDEX\b|USING INTEGER PRIMARY KEY", line), (
                    plan
                )
        assert not in_order or "USE TEMP B-TREE FOR ORDER BY" not in plan, plan


def pages(rows, ordering) -> dict[str, object]:
    """The first page and a page after an item of the middle, as NewestFirstPage reads them."""
    paginator = NewestFirstPage(ordering=ordering)
    ordered = rows.order_by(*paginator.ordering)
    middle = ordered.values(*[f.lstrip("-") for f in paginator.ordering])[ROWS // 200]
    return {"first": ordered[:100], "before": ordered.filter(paginator.after(middle))[:101]}


@pytest.mark.parametrize("page", ["first", "before"])
@pytest.mark.parametrize("reader", ["admin", "manager"])
def test_an_audit_page_reads_an_index_in_order_at_50k_entries(logs, reader, page):
    rows = audit_list(user=logs[reader])
    assert_indexed(pages(rows, ("-created_at", "-id"))[page].explain(), in_order=reader == "admin")


@pytest.mark.parametrize("page", ["first", "before"])
def test_a_delivery_page_reads_an_index_in_order_at_50k_deliveries(logs, page):
    rows = delivery_list(user=logs["manager"])
    assert_indexed(pages(rows, NewestFirstPage.ordering)[page].explain(), in_order=False)
