"""Nodes are written by apps.cluster.services: registration, heartbeats, loss."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.cluster.models import GPU, Node
from apps.cluster.services import node_heartbeat, node_mark_lost, node_register
from worker.inventory import simulated_gpus

pytestmark = pytest.mark.django_db


def register(gpus: int = 2) -> Node:
    return node_register(name="node-a", gpus=simulated_gpus(gpus), cpu_count=8, memory_mb=32768,
                         hostname="host-a", worker_pid=1234)


def test_it_registers_the_node_and_its_gpus():
    node = register()
    assert (node.cpu_count, node.memory_mb, node.hostname, node.simulated) == (8, 32768, "host-a", True)
    assert list(node.gpus.values_list("index", flat=True)) == [0, 1]
    assert node.is_alive()


def test_registering_again_drops_gpus_that_are_gone():
    register(4)
    node = register(2)
    assert GPU.objects.filter(node=node).count() == 2


def test_a_lost_node_is_active_again_when_it_registers_or_reports():
    node = register()
    Node.objects.filter(pk=node.pk).update(state=Node.State.LOST)
    assert register().state == Node.State.ACTIVE
    Node.objects.filter(pk=node.pk).update(state=Node.State.LOST)
    node_heartbeat(node)
    assert Node.objects.get(pk=node.pk).state == Node.State.ACTIVE


def test_a_heartbeat_refreshes_gpu_readings():
    node = register()
    readings = simulated_gpus(2)
    readings[1].memory_used_mb, readings[1].utilization = 2048, 77
    node_heartbeat(node, gpus=readings)
    assert GPU.objects.filter(node=node, index=1).values_list("memory_used_mb", "utilization").get() == (2048, 77)


def test_a_node_is_marked_lost_only_if_still_silent():
    node = register()
    assert not node_mark_lost(node, silent_since=timezone.now() - timedelta(seconds=30))  # reported just now
    assert node_mark_lost(node, silent_since=timezone.now() + timedelta(seconds=1))
    assert not node_mark_lost(node, silent_since=timezone.now() + timedelta(seconds=1))  # already lost
    assert Node.objects.get(pk=node.pk).state == Node.State.LOST


def test_a_node_without_writable_cgroups_says_limits_are_not_enforced(alice):
    """At registration and in the cluster view (API and dashboard)."""
    from tests.conftest import api_client
    from worker.executors.cgroups import probe

    limits = probe(proc_cgroup="", mountinfo="").as_dict()
    node_register(name="node-a", gpus=simulated_gpus(1), cpu_count=8, memory_mb=32768, hostname="a",
                  worker_pid=1, limits=limits)
    node_register(name="node-b", gpus=simulated_gpus(1), cpu_count=8, memory_mb=32768, hostname="b",
                  worker_pid=2, limits={"version": "v1", "enforced": ["memory", "cpu", "pids"],
                                        "summary": "cgroup v1: memory, cpu, pids limits enforced"})
    nodes = {n["name"]: n for n in api_client(alice).get("/api/v1/cluster/").json()["nodes"]}
    assert nodes["node-a"]["limits_enforced"] is False
    assert nodes["node-a"]["limits"].startswith("limits not enforced (no cgroup hierarchy")
    assert nodes["node-b"]["limits_enforced"] is True

    from django.test import Client

    client = Client()
    client.force_login(alice)
    page = client.get("/").content.decode()
    assert page.count(">limits not enforced</span>") == 1


def test_a_worker_registers_what_its_cgroups_enforce_and_its_images(settings):
    from worker.node import register_this_host

    settings.NODE_IMAGES = ["ultralytics/yolov8:latest", "local", "team/extra:2"]
    node = register_this_host(name="node-c", gpus=simulated_gpus(1))
    assert node.images == ["local", "team/extra:2", "ultralytics/yolov8:latest"]
    assert node.limits["summary"]  # whatever this host allows, it is said
    settings.ATTEMPT_CGROUPS = False
    node = register_this_host(name="node-c", gpus=simulated_gpus(1))
    assert node.limits["summary"] == "limits not enforced (ATTEMPT_CGROUPS=false)"
    assert not node.limits_enforced


def test_a_node_may_advertise_more_than_the_machine_has_and_keeps_both(settings):
    """gpu_worker --cpus 8 --memory 32Gi: the scheduler places by the advertised numbers; the
    machine's own are kept beside them (enforced limits never exceed them)."""
    import os

    from worker.inventory import host_memory_mb
    from worker.node import register_this_host

    settings.ATTEMPT_CGROUPS = False
    node = register_this_host(name="demo", gpus=simulated_gpus(1), cpus=64, memory_mb=512 * 1024)
    assert (node.cpu_count, node.memory_mb) == (64, 512 * 1024)
    assert (node.host_cpu_count, node.host_memory_mb) == (os.cpu_count(), host_memory_mb())
    assert node.features == [], "no TensorRT on simulated GPUs"
    again = register_this_host(name="demo", gpus=simulated_gpus(1))
    assert again.cpu_count == os.cpu_count(), "without the options the node advertises the machine"


def test_a_worker_that_stops_marks_its_node_lost_unless_a_successor_has_it():
    from apps.cluster.services import node_stopped

    node = register()
    assert not node_stopped(node, hostname="host-a", worker_pid=999)  # not the worker that registered it
    assert not node_stopped(node, hostname="host-b", worker_pid=1234)
    assert Node.objects.get(pk=node.pk).state == Node.State.ACTIVE
    assert node_stopped(node, hostname="host-a", worker_pid=1234)
    stopped = Node.objects.get(pk=node.pk)
    assert stopped.state == Node.State.LOST and not stopped.is_alive()  # at once, not after the grace
    assert not node_stopped(node, hostname="host-a", worker_pid=1234)  # already
    assert register().state == Node.State.ACTIVE  # it comes back when its worker starts again
    node_register(name="node-a", gpus=simulated_gpus(2), cpu_count=8, memory_mb=32768, hostname="host-a",
                  worker_pid=5678)  # a successor started before the old worker got to say it stopped
    assert not node_stopped(node, hostname="host-a", worker_pid=1234)
    assert Node.objects.get(pk=node.pk).state == Node.State.ACTIVE


def test_a_worker_told_to_stop_marks_its_node_stopping_until_it_is_lost_or_registers_again():
    from apps.cluster.services import node_stopped, node_stopping

    node = register()
    assert not node_stopping(node, hostname="host-a", worker_pid=999)  # not the worker that registered it
    assert node_stopping(node, hostname="host-a", worker_pid=1234)
    node_heartbeat(node)  # it goes on beating while its slots exit
    stopping = Node.objects.get(pk=node.pk)
    assert stopping.state == Node.State.STOPPING and stopping.is_alive()  # alive: its jobs are not requeued yet
    assert node_stopped(node, hostname="host-a", worker_pid=1234)
    assert Node.objects.get(pk=node.pk).state == Node.State.LOST
    assert not node_stopping(node, hostname="host-a", worker_pid=1234)  # lost stays lost
    assert register().state == Node.State.ACTIVE
    assert node_stopping(node, hostname="host-a", worker_pid=1234)
    assert register().state == Node.State.ACTIVE  # its worker restarted (or stop was undone)
    Node.objects.filter(pk=node.pk).update(state=Node.State.DRAINING)  # an admin's drain is theirs
    assert not node_stopping(node, hostname="host-a", worker_pid=1234)


def test_a_lost_or_draining_nodes_gpus_are_not_shown_as_idle_capacity(alice):
    """A cleanly stopped worker's node is lost; the dashboard still said its GPU was "idle" and
    counted it (manager trial)."""
    from django.test import Client

    from tests.conftest import api_client

    register(2)
    node_register(name="node-b", gpus=simulated_gpus(1), cpu_count=8, memory_mb=32768, hostname="host-b",
                  worker_pid=99)
    page = Client()
    page.force_login(alice)
    totals = api_client(alice).get("/api/v1/cluster/").json()["totals"]
    assert (totals["gpus"], totals["gpus_available"]) == (3, 3)
    assert "gpu-unavailable" not in page.get("/dashboard/live/").content.decode()
    node_mark_lost(Node.objects.get(name="node-b"), silent_since=timezone.now() + timedelta(seconds=1))
    Node.objects.filter(name="node-a").update(state=Node.State.DRAINING)
    totals = api_client(alice).get("/api/v1/cluster/").json()["totals"]
    assert (totals["gpus"], totals["gpus_available"]) == (3, 0)
    html = page.get("/dashboard/live/").content.decode()
    assert html.count("not available (node draining)") == 2 and html.count("not available (node not reporting)") == 1
    assert ">idle<" not in html and 'id="gpus-available">0 available' in html


def test_a_drained_node_whose_worker_restarts_stays_drained_until_resumed():
    """Operator trial 20, F4: drained for a PSU swap, its worker stopped and started again, the node
    came back active (the reason still stored) and took work before anyone pressed Resume."""
    from apps.cluster.services import node_drain, node_resume, node_stopped

    node = register()
    assert node_drain(node=node, reason="PSU replacement")
    assert node_stopped(node, hostname="host-a", worker_pid=1234)
    assert Node.objects.get(pk=node.pk).state == Node.State.LOST
    back = register()
    assert (back.state, back.drain_reason) == (Node.State.DRAINING, "PSU replacement")

    Node.objects.filter(pk=node.pk).update(state=Node.State.LOST)  # silent past the grace, then it beats
    node_heartbeat(node)
    assert Node.objects.get(pk=node.pk).state == Node.State.DRAINING

    assert node_resume(node=node)
    Node.objects.filter(pk=node.pk).update(state=Node.State.LOST)
    assert register().state == Node.State.ACTIVE  # resumed: back to work as before
