"""A node is deleted only once its worker is gone and it holds nothing, and a worker whose
node row was deleted anyway registers it again (trial 14, F28)."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.cluster.models import Node
from tests.conftest import admin_client
from tests.jobs.factories import make_job
from worker.inventory import simulated_gpus
from worker.node import Heartbeat, register_this_host

pytestmark = pytest.mark.django_db


def delete_page(node) -> str:
    return f"/admin/cluster/node/{node.pk}/delete/"


def test_a_superuser_cannot_delete_a_node_whose_worker_reports(superuser, node):
    client = admin_client(superuser)
    refused = client.post(delete_page(node), {"post": "yes"}, follow=True)
    html = refused.content.decode()
    assert Node.objects.filter(pk=node.pk).exists()
    assert "Not deleted: node node-a reported " in html and " s ago (within NODE_GRACE_S=30 s)" in html
    assert "drain it and stop its worker first" in html
    assert client.get(delete_page(node)).status_code == 302  # not even the confirmation page


def test_a_superuser_cannot_delete_a_node_holding_a_running_job_even_once_silent(superuser, teams, bob, node):
    make_job(team=teams["vision"], user=bob, state="running", node=node, gpu_indices=[0])
    Node.objects.filter(pk=node.pk).update(last_heartbeat=timezone.now() - timedelta(hours=1), state="lost")
    html = admin_client(superuser).post(delete_page(node), {"post": "yes"}, follow=True).content.decode()
    assert "node node-a holds 1 starting or running job(s)" in html
    assert Node.objects.filter(pk=node.pk).exists()


def test_the_bulk_delete_action_refuses_a_live_node_too(superuser, node):
    client = admin_client(superuser)
    html = client.post("/admin/cluster/node/", {"action": "delete_selected", "_selected_action": [str(node.pk)],
                                                "post": "yes"}).content.decode()
    assert "Cannot delete node" in html and "drain it and stop its worker first" in html
    assert Node.objects.filter(pk=node.pk).exists()


def test_a_stopped_nodes_row_may_be_deleted(superuser, node):
    Node.objects.filter(pk=node.pk).update(state="lost")  # its worker stopped cleanly
    admin_client(superuser).post(delete_page(node), {"post": "yes"})
    assert not Node.objects.filter(pk=node.pk).exists()


def test_a_worker_whose_node_row_was_deleted_registers_it_again_and_says_so(db, caplog):
    def register() -> Node:
        return register_this_host(name="node-a", gpus=simulated_gpus(2))

    heartbeat = Heartbeat(register(), interval_s=1, simulated=True, register=register)
    Node.objects.all().delete()  # as the admin did before it refused
    with caplog.at_level(logging.WARNING, logger="worker.node"):
        heartbeat.beat()
    node = Node.objects.get(name="node-a")
    assert heartbeat.node.pk == node.pk and node.is_alive() and node.gpus.count() == 2
    assert "node node-a: its row was deleted while this worker runs (in admin?); registering it again" in caplog.text

