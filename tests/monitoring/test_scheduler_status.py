"""Multi-node trial M9: with the scheduler stopped, the queue kept counting down estimates already
in the past ("start any moment … expected 21:42 UTC" minutes later) and nothing said why."""

from __future__ import annotations

import time

from django.test import Client

from apps.monitoring import recorders
from tests.conftest import api_client
from tests.portal.helpers import submit


def test_the_status_says_whether_the_scheduler_plans(db):
    assert recorders.scheduler_status()["planning"] is False  # nothing recorded yet
    assert "not planned yet" in recorders.scheduler_status()["note"]
    recorders.scheduler_pass_record(0.01, finished_at=time.time() - 5)
    status = recorders.scheduler_status()
    assert status["planning"] is True and status["note"] == "" and status["seconds_since"] in (5, 6)
    recorders.scheduler_pass_record(0.01, finished_at=time.time() - 300)
    status = recorders.scheduler_status()
    assert status["planning"] is False and status["seconds_since"] >= 300
    assert "has not planned since" in status["note"] and "5 min ago" in status["note"]


def test_the_queue_says_so_where_people_wait(alice, demo_registered):
    recorders.scheduler_pass_record(0.01, finished_at=time.time() - 600)
    job = submit(alice, task_name="waits")
    body = api_client(alice).get("/api/v1/cluster/").json()
    assert body["scheduler"]["planning"] is False and "has not planned since" in body["scheduler"]["note"]
    client = Client()
    client.force_login(alice)
    assert "has not planned since" in client.get("/").content.decode()
    assert "has not planned since" in client.get(f"/jobs/{job.pk}/").content.decode()
    recorders.scheduler_pass_record(0.01)  # planning again: nothing said
    assert api_client(alice).get("/api/v1/cluster/").json()["scheduler"]["note"] == ""
    assert "has not planned" not in client.get("/").content.decode()
