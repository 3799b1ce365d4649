"""The admin's change lists read a page of rows in a fixed number of queries, however many rows the
page shows: Django's own select_related follows only the non-null foreign keys in ``list_display``,
so a nullable one (a job's node, an audit entry's team, a usage record's or model version's job)
was read once per row — 100 more queries per page of a table that only grows (managers' admin
week, trial30b)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.accounts.models import AuditEntry
from apps.accounts.services import audit_record
from apps.quotas.models import UsageRecord
from apps.registry.models import ModelVersion
from tests.conftest import admin_client
from tests.jobs.factories import make_job

pytestmark = pytest.mark.django_db


def _jobs(teams, user, node, n: int, start: int) -> list:
    return [
        make_job(
            team=teams["vision"], user=user, state="running", node=node, task_name=f"j{start + i}", gpu_indices=[0]
        )
        for i in range(n)
    ]


def _audit(teams, user, node, n: int, start: int) -> None:
    for i in range(n):
        audit_record(
            actor=user,
            action=AuditEntry.Action.JOB_CANCEL,
            team=teams["vision"],
            target_id=str(start + i),
            message=f"entry {start + i}",
        )


def _usage(teams, user, node, n: int, start: int) -> None:
    now = timezone.now()
    for job in _jobs(teams, user, node, n, start):
        UsageRecord.objects.create(
            job=job,
            team=teams["vision"],
            user=user,
            attempt=1,
            priority_class="medium",
            gpu_seconds=60,
            started_at=now - timedelta(minutes=1),
            ended_at=now,
        )


def _versions(teams, user, node, n: int, start: int) -> None:
    for i, job in enumerate(_jobs(teams, user, node, n, start)):
        ModelVersion.objects.create(
            team=teams["vision"],
            name="pcb",
            version=start + i + 1,
            job=job,
            weights_key=f"jobs/{job.pk}/train/weights/best.pt",
        )


@pytest.mark.parametrize(
    ("url", "rows"),
    [
        ("/admin/jobs/job/", _jobs),
        ("/admin/accounts/auditentry/", _audit),
        ("/admin/quotas/usagerecord/", _usage),
        ("/admin/registry/modelversion/", _versions),
    ],
)
@pytest.mark.parametrize("who", ["superuser", "manager"])
def test_a_change_list_reads_a_page_in_as_many_queries_for_3_rows_as_for_30(url, rows, who, request, teams, bob, node):
    viewer = request.getfixturevalue(who)
    client = admin_client(viewer)
    rows(teams, bob, node, 3, 0)
    with CaptureQueriesContext(connection) as few:
        assert client.get(url).status_code == 200
    rows(teams, bob, node, 27, 3)
    with CaptureQueriesContext(connection) as many:
        response = client.get(url)
    assert response.status_code == 200
    assert response.context["cl"].result_count >= 30
    assert len(many) == len(few), [q["sql"] for q in many.captured_queries][len(few) - 2 : len(few) + 3]


@pytest.mark.parametrize("action", ["cancel", "requeue"])
def test_an_action_on_30_jobs_asks_as_many_queries_as_on_3_when_it_changes_nothing(action, manager, teams, bob, node):
    """The admin audit read each selected row, its team and its user, one by one, before and after
    the action: 3 queries a job before the action did anything (the cancel's confirmation page that
    asks why included), 300 for a page of 100 (trial30b). Here the cancel shows its page and the
    requeue leaves queued jobs alone: no service runs, so any difference is the reading."""
    client = admin_client(manager)

    def post(jobs):
        ids = [str(job.pk) for job in jobs]
        with CaptureQueriesContext(connection) as queries:
            response = client.post("/admin/jobs/job/", {"action": action, "_selected_action": ids})
        assert response.status_code in (200, 302)
        return len(queries)

    few = [make_job(team=teams["vision"], user=bob, task_name=f"q{i}") for i in range(3)]
    many = few + [make_job(team=teams["vision"], user=bob, task_name=f"q{i}") for i in range(3, 30)]
    assert post(many) == post(few)
