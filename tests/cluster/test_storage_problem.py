"""A node whose worker cannot read the shared storage (its mount dropped) takes no new work and
says why wherever a drain is explained: queued jobs' reasons, GET cluster/, the dashboard, admin."""

from __future__ import annotations

from html import escape

import pytest

from apps.cluster.models import Node
from apps.cluster.services import node_heartbeat, node_storage_problem_set
from apps.jobs.models import Job, JobState
from apps.jobs.services import job_submit
from apps.jobs.spec import parse_spec
from apps.scheduling.loop import plan_and_start
from tests.conftest import admin_client, api_client

pytestmark = pytest.mark.django_db

LOST = "the shared DATA_DIR is not readable on this node (the newest datasets' files are missing): is it mounted?"


def test_a_node_without_the_shared_storage_gets_no_job_and_everyone_sees_why(superuser, bob, node, demo_registered):
    assert node_storage_problem_set(node, problem=LOST)
    assert not node_storage_problem_set(node, problem=LOST)  # said once
    document = {"task_name": "waits", "command": "yolo train data=demo model=yolov8n.yaml epochs=3",
                "resources": {"gpu": 1}, "timeout": 3600}
    job, _ = job_submit(user=bob, spec=parse_spec(document))
    plan_and_start()
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
    assert "node-a (shared storage unreachable)" in job.reason, job.reason
    (shown,) = api_client(bob).get("/api/v1/cluster/").json()["nodes"]
    assert (shown["state"], shown["storage_problem"]) == ("active", LOST)
    assert api_client(bob).get("/api/v1/cluster/").json()["totals"]["gpus_available"] == 0
    dashboard = admin_client(bob).get("/dashboard/live/").content.decode()
    assert escape(LOST) in dashboard and "not available (shared storage unreachable)" in dashboard
    assert escape(LOST) in admin_client(superuser).get("/admin/cluster/node/").content.decode()

    assert node_heartbeat(node, storage_problem="")  # its worker finds the storage again
    assert Node.objects.get(pk=node.pk).storage_problem == ""
    plan_and_start()
    assert Job.objects.get(pk=job.pk).state == JobState.STARTING


def test_a_heartbeat_that_does_not_look_leaves_the_storage_problem_alone(node):
    """An object-store node (or the slurm_agent's) reports nothing about a shared filesystem."""
    node_storage_problem_set(node, problem=LOST)
    assert node_heartbeat(node, gpus=None)
    assert Node.objects.get(pk=node.pk).storage_problem == LOST


def test_registering_again_clears_it(node):
    """The worker checks the storage before it registers (gpu_worker refuses to start without it)."""
    from worker.inventory import simulated_gpus
    from worker.node import register_this_host

    node_storage_problem_set(node, problem=LOST)
    register_this_host(name="node-a", gpus=simulated_gpus(2))
    assert Node.objects.get(pk=node.pk).storage_problem == ""
