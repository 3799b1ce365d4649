"""A queued job that only a draining, lost or silent node could hold is told so, naming the
nodes, not that no node can ever fit it (trial 14, F5)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.cluster.models import Node
from apps.jobs.models import Job, JobState
from apps.jobs.services import job_submit
from apps.jobs.spec import parse_spec
from apps.scheduling.loop import plan_and_start
from tests.conftest import admin_client, api_client

pytestmark = pytest.mark.django_db


def submit(user):
    document = {"task_name": "waits", "command": "yolo train data=demo model=yolov8n.yaml epochs=3",
                "resources": {"gpu": 1}, "timeout": 3600}
    job, _ = job_submit(user=user, spec=parse_spec(document))
    return job


def queue_reason(user, job) -> str:
    entries = api_client(user).get("/api/v1/queue/").json()["results"]
    return next(e["reason"] for e in entries if e["id"] == str(job.pk))


def test_a_job_waiting_for_the_only_fitting_node_while_it_drains_is_told_so(superuser, bob, demo_registered, node):
    admin = admin_client(superuser)
    admin.post("/admin/cluster/node/", {"action": "drain", "_selected_action": [str(node.pk)], "apply": "yes", "reason": "maintenance"})
    job = submit(bob)
    plan_and_start()
    reason = queue_reason(bob, job)
    assert "the nodes that could hold 1 GPU on one node take no new work: node-a (draining: maintenance)" in reason
    assert "ever" not in reason and "CPU/RAM" not in reason

    admin.post("/admin/cluster/node/", {"action": "resume", "_selected_action": [str(node.pk)]})
    plan_and_start()
    assert Job.objects.get(pk=job.pk).state == JobState.STARTING


def test_a_silent_node_is_named_as_not_reporting(bob, demo_registered, node):
    Node.objects.filter(pk=node.pk).update(last_heartbeat=timezone.now() - timedelta(minutes=1))
    job = submit(bob)
    plan_and_start()
    assert "take no new work: node-a (not reporting)" in queue_reason(bob, job)
