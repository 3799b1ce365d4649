"""A job's image decides where it may run: placed only on a node that has it, refused at submit
when no node does (with the images there are)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from apps.scheduling.policy import admission_error, plan
from tests.conftest import SEED_SPEC, api_client

from .policy_helpers import NOW, fair, job, node, state

YOLO = "ultralytics/yolov8:latest"


def test_a_job_is_placed_only_on_a_node_with_its_image():
    plain = replace(node("plain", gpus=8), images=frozenset({"local"}))
    yolo = replace(node("yolo", gpus=1), images=frozenset({YOLO}))
    result = plan(state([plain, yolo], [job("j", image=YOLO)]), NOW)
    assert [(s.job_id, s.node) for s in result.starts] == [("j", "yolo")]


def test_a_job_without_an_image_runs_anywhere():
    plain = replace(node("plain", gpus=1), images=frozenset())
    assert [s.node for s in plan(state([plain], [job("j")]), NOW).starts] == ["plain"]


def test_a_job_waits_while_the_only_node_with_its_image_is_busy():
    from .policy_helpers import running

    plain = replace(node("plain", gpus=8), images=frozenset({"local"}))
    yolo = replace(node("yolo", gpus=1), images=frozenset({YOLO}))
    result = plan(state([plain, yolo], [job("j", image=YOLO)], [running("r", "yolo", (0,))]), NOW)
    assert result.starts == ()
    assert result.queue[0].estimated_start is not None


def test_no_node_with_the_image_is_why_a_job_never_starts():
    plain = replace(node("plain", gpus=8), images=frozenset({"local"}))
    result = plan(state([plain], [job("j", image="pytorch/pytorch:2.4")]), NOW)
    assert result.starts == ()
    assert "no schedulable node has image pytorch/pytorch:2.4" in result.queue[0].reason
    assert admission_error([plain], job("j", image="pytorch/pytorch:2.4"), fair()) is not None


def test_placement_needs_the_gpu_memory_the_driver_reports_free():
    """A fractional job asking 30 GiB does not go on a GPU whose driver reports 20 GiB free."""
    from apps.scheduling.policy import GpuInfo, NodeInfo

    busy = NodeInfo("busy", (GpuInfo(0, "A100", 81920, memory_free_mb=20480),), 128000, 1_048_576)
    idle = NodeInfo("idle", (GpuInfo(0, "A100", 81920, memory_free_mb=81000),), 128000, 1_048_576)
    result = plan(state([busy, idle], [job("j", gpus=0.25, gpu_memory_mb=30720)]), NOW)
    assert [s.node for s in result.starts] == ["idle"]
    # Memory in use now frees up later: the job is not refused as never fitting.
    assert admission_error([busy], job("j", gpus=0.25, gpu_memory_mb=30720), fair()) is None


def test_a_whole_gpu_job_asking_gpu_memory_needs_it_free_too():
    from apps.scheduling.policy import GpuInfo, NodeInfo

    node_ = NodeInfo("n", (GpuInfo(0, "A100", 81920, memory_free_mb=1024), GpuInfo(1, "A100", 81920)), 128000,
                     1_048_576)
    result = plan(state([node_], [job("j", gpus=1, gpu_memory_mb=40960)]), NOW)
    assert [s.gpu_indices for s in result.starts] == [(1,)]


# --- at submit --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_job_whose_image_no_node_has_is_refused_listing_the_images(bob, demo_registered, node):
    response = api_client(bob).post("/api/v1/jobs/", SEED_SPEC.replace(YOLO, "pytorch/pytorch:2.4"),
                                    content_type="application/yaml")
    assert response.status_code == 400
    message = response.json()["image"][0]
    assert "no node runs image 'pytorch/pytorch:2.4'" in message
    assert f"available: local, {YOLO}" in message


@pytest.mark.django_db
def test_the_seed_image_is_what_a_worker_runs_by_default(bob, demo_registered, node):
    assert node.images == ["local", YOLO]
    response = api_client(bob).post("/api/v1/jobs/", SEED_SPEC, content_type="application/yaml")
    assert response.status_code == 201, response.content


@pytest.mark.django_db
def test_a_job_is_placed_on_the_node_that_has_its_image(bob, demo_registered, node):
    from apps.cluster.services import node_register
    from apps.jobs.models import Job
    from apps.scheduling.loop import plan_and_start
    from worker.inventory import simulated_gpus

    node_register(name="node-b", gpus=simulated_gpus(4), cpu_count=8, memory_mb=65536, hostname="b",
                  worker_pid=None, images=["team/special:1"])
    client = api_client(bob)
    special = client.post("/api/v1/jobs/", SEED_SPEC.replace(YOLO, "team/special:1"),
                          content_type="application/yaml").json()["id"]
    seed = client.post("/api/v1/jobs/", SEED_SPEC.replace("epochs=2", "epochs=3"),
                       content_type="application/yaml").json()["id"]
    plan_and_start()
    assert Job.objects.get(pk=special).node.name == "node-b"
    assert Job.objects.get(pk=seed).node.name == "node-a"
