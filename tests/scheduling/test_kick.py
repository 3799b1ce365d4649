"""A submit's kick reaches the scheduler (real Redis), from the process's kicker thread, and
kicks asked for while one is being sent are coalesced into one more, never into none."""

from __future__ import annotations

import threading
import time

import pytest

from apps.scheduling import kick
from apps.scheduling.kick import _Kicker, wait_for_kick
from tests.conftest import api_client


@pytest.mark.django_db
def test_a_committed_submit_wakes_the_scheduler(bob, demo_registered, node, django_capture_on_commit_callbacks):
    assert not wait_for_kick(0.01)  # nothing pending before
    with django_capture_on_commit_callbacks(execute=True):
        response = api_client(bob).post("/api/v1/jobs/", {
            "task_name": "kicked", "team": "vision", "allow_duplicate": True, "resources": {"gpu": 1},
            "command": "yolo train data=demo model=yolov8n.yaml epochs=1 imgsz=64"}, format="json")
    assert response.status_code == 201
    assert wait_for_kick(5)  # sent by the kicker thread, through the test's Redis


@pytest.mark.django_db
def test_a_refused_submit_kicks_nobody(bob, demo_registered, node, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = api_client(bob).post("/api/v1/jobs/", {
            "task_name": "refused", "team": "vision", "resources": {"gpu": 1},
            "command": "yolo train data=nope model=yolov8n.yaml epochs=1 imgsz=64"}, format="json")
    assert response.status_code == 400
    time.sleep(0.2)
    assert not wait_for_kick(0.01)


def test_kicks_asked_for_during_a_send_are_coalesced_into_one_more(monkeypatch):
    sending, release, sends = threading.Event(), threading.Event(), []

    def slow_kick():
        sends.append(time.monotonic())
        sending.set()
        release.wait(5)

    monkeypatch.setattr(kick, "kick_scheduler", slow_kick)
    kicker = _Kicker(interval_s=0)
    kicker.soon()
    assert sending.wait(5)  # the first send is in flight (blocked)
    asked = time.monotonic()
    for _ in range(50):
        kicker.soon()
    release.set()
    deadline = time.monotonic() + 5
    while kicker.sent < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # no third send follows
    assert kicker.sent == 2 and len(sends) == 2
    assert sends[1] >= asked  # the 50 were answered by a send that began after them


def test_every_kick_asked_for_is_followed_by_a_send(monkeypatch):
    """Never lost: each soon() is followed by a send that starts after it, however they interleave."""
    sends: list[float] = []
    monkeypatch.setattr(kick, "kick_scheduler", lambda: (sends.append(time.monotonic()), time.sleep(0.002)))
    kicker = _Kicker(interval_s=0)
    asked = []
    for n in range(200):
        asked.append(time.monotonic())
        kicker.soon()
        if n % 7 == 0:
            time.sleep(0.003)
    deadline = time.monotonic() + 5
    while (not sends or sends[-1] < asked[-1]) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sends and sends[-1] >= asked[-1]
    assert len(sends) < len(asked)  # coalesced


def test_at_most_one_kick_per_interval_and_the_last_request_is_kicked_for(monkeypatch):
    sends: list[float] = []
    monkeypatch.setattr(kick, "kick_scheduler", lambda: sends.append(time.monotonic()))
    kicker = _Kicker(interval_s=0.05)
    started = time.monotonic()
    while time.monotonic() - started < 0.5:  # a steady stream of submits for 0.5 s
        kicker.soon()
        time.sleep(0.001)
    last = time.monotonic()
    kicker.soon()
    deadline = time.monotonic() + 5
    while sends[-1] < last and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sends[-1] >= last  # the last one asked for is kicked for, within about one interval
    assert sends[-1] - last < 0.5
    gaps = [b - a for a, b in zip(sends, sends[1:], strict=False)]
    assert len(sends) <= 0.6 / 0.05 + 2 and min(gaps) >= 0.045, gaps
