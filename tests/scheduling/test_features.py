"""A job that needs a node feature (a TensorRT export needs "tensorrt") is placed only where it is,
and refused at submit when no node advertises it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from apps.scheduling.policy import plan
from tests.conftest import api_client

from .policy_helpers import NOW, job, node, state


def test_an_engine_export_is_placed_only_on_a_tensorrt_node():
    plain = node("plain", gpus=8)
    trt = replace(node("trt", gpus=1), features=("tensorrt",))
    result = plan(state([plain, trt], [job("engine", requires=("tensorrt",)), job("onnx")]), NOW)
    assert {s.job_id: s.node for s in result.starts} == {"engine": "trt", "onnx": "plain"}


def test_without_such_a_node_it_waits():
    result = plan(state([node("plain", gpus=8)], [job("engine", requires=("tensorrt",))]), NOW)
    assert list(result.starts) == []


@pytest.mark.django_db
def test_an_engine_export_is_refused_at_submit_when_no_node_advertises_tensorrt(bob, demo_registered, node):
    body = {"task_name": "e", "command": "yolo export model=pcb:v1 format=engine", "user": "vision"}
    response = api_client(bob).post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 400
    assert "nodes that advertise TensorRT" in response.json()["command.format"][0]
    assert "resources" not in response.json(), "said once, under the field that asks for it"
