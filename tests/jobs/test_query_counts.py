"""Lists cost the same number of SQL queries with 2 rows as with 30 (no query per row)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.jobs.models import JobEvent, JobState, LogChunk, MetricPoint
from apps.registry.models import ModelVersion
from tests.conftest import api_client

from .factories import make_job

pytestmark = pytest.mark.django_db


def make_jobs(count: int, *, teams, users, node) -> list:
    """A mix of what lists show: queued, running on a node, succeeded with a model version."""
    jobs = []
    for n in range(count):
        user = users[n % len(users)]
        team = teams["vision"]
        kind = n % 3
        if kind == 0:
            job = make_job(team=team, user=user, state=JobState.QUEUED, task_name=f"q{n}", queue_position=n)
        elif kind == 1:
            job = make_job(team=team, user=user, state=JobState.RUNNING, task_name=f"r{n}", node=node,
                           gpu_indices=[0])
        else:
            job = make_job(team=team, user=user, state=JobState.SUCCEEDED, task_name=f"s{n}")
            ModelVersion.objects.create(team=team, name=f"s{n}", version=1, job=job, weights_key="jobs/x/best.pt", size=1)
        jobs.append(job)
    return jobs


def queries(client, url: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    return len(captured)


@pytest.mark.parametrize("url", ["/api/v1/jobs/", "/api/v1/jobs/?mine=true", "/api/v1/jobs/?state=running",
                                 "/api/v1/queue/", "/api/v1/cluster/"])
def test_a_list_endpoint_costs_the_same_queries_for_2_and_30_jobs(url, teams, alice, bob, node):
    client = api_client(alice)
    make_jobs(2, teams=teams, users=[alice, bob], node=node)
    client.get(url)  # warm: token last-used stamp, caches
    few = queries(client, url)
    make_jobs(28, teams=teams, users=[alice, bob], node=node)
    assert queries(client, url) == few


@pytest.mark.parametrize("model", [JobEvent, LogChunk, MetricPoint])
def test_a_job_history_endpoint_costs_the_same_queries_for_2_and_300_rows(model, teams, alice):
    job = make_job(team=teams["vision"], user=alice, state=JobState.RUNNING)
    path = {JobEvent: "events", LogChunk: "logs", MetricPoint: "metrics"}[model]
    client = api_client(alice)
    url = f"/api/v1/jobs/{job.pk}/{path}/"

    def add(first: int, count: int) -> None:
        common = {"job": job, "attempt": 1}
        for seq in range(first, first + count):
            if model is JobEvent:
                JobEvent.objects.create(seq=seq, kind="progress", **common)
            elif model is LogChunk:
                LogChunk.objects.create(seq=seq, text="line\n", **common)
            else:
                MetricPoint.objects.create(seq=seq, epoch=seq, values={"m": 1.0}, **common)

    add(1, 2)
    client.get(url)
    few = queries(client, url)
    add(3, 298)
    assert queries(client, url) == few


@pytest.mark.parametrize("url", ["/jobs/?scope=team", "/jobs/?scope=mine", "/", "/dashboard/live/"])
def test_a_portal_page_costs_the_same_queries_for_2_and_30_jobs(url, teams, alice, bob, node, client):
    client.force_login(alice)
    make_jobs(2, teams=teams, users=[alice, bob], node=node)
    client.get(url)
    few = queries(client, url)
    make_jobs(28, teams=teams, users=[alice, bob], node=node)
    assert queries(client, url) == few


def test_a_job_reads_the_same_through_the_quick_serializer_loop_as_through_drfs(teams, alice, bob, node):
    """JobOut reads values with plain getattr where it can (apps/jobs/api.py): each row of a
    list must come out exactly as DRF's own loop makes it, whatever the job's state."""
    from rest_framework import serializers

    from apps.jobs.api import JobOut
    from apps.jobs.selectors import job_list

    made = make_jobs(6, teams=teams, users=[alice, bob], node=node)
    made[0].parent = made[1]
    made[0].error = "boom"
    made[0].save()
    rows = list(job_list(user=alice).select_related("model_version").order_by("created_at"))
    assert len(rows) == 6
    with CaptureQueriesContext(connection) as captured:
        quick = JobOut(rows, many=True).data
    assert len(captured) == 0, [q["sql"] for q in captured]  # the parent is read as its id, not fetched
    drf = [serializers.ModelSerializer.to_representation(JobOut(job), job) for job in rows]
    assert [dict(row) for row in quick] == drf
    assert quick[0]["parent"] == made[1].pk and quick[2]["model_version"] is not None
    assert quick[1]["node"] == node.name and quick[0]["node"] is None


def test_a_lone_job_reads_the_same_through_the_threads_reader_as_through_drfs(teams, alice, bob, node):
    """JobOut(job).data (a submit's 201, a job's page) is read by a JobOut the thread keeps
    bound (apps/jobs/api.py): each job must come out as DRF's own loop makes it, and the
    response data still names its own serializer and instance."""
    from rest_framework import serializers

    from apps.jobs.api import JobOut

    made = make_jobs(4, teams=teams, users=[alice, bob], node=node)
    made[0].parent = made[1]
    made[0].error = "boom"
    made[0].save()
    for job in (*made, made[0]):
        job = type(job).objects.select_related("model_version").get(pk=job.pk)
        out = JobOut(job)
        data = out.data
        assert dict(data) == serializers.ModelSerializer.to_representation(JobOut(job), job)
        assert data.serializer is out and out.instance is job
        assert "fields" not in out.__dict__  # this one's fields were never built
    assert JobOut(made[1]).data["node"] == node.name and JobOut(made[0]).data["parent"] == made[1].pk
    # With a context a serializer reads with its own fields.
    with_context = JobOut(made[2], context={"x": 1})
    assert dict(with_context.data) == dict(JobOut(made[2]).data) and "fields" in with_context.__dict__
