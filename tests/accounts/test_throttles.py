"""The rate throttles: a sliding-window counter in the shared cache's Redis (apps.accounts.throttles)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import redis

from apps.accounts.throttles import SharedCacheThrottle, SubmitThrottle
from tests.conftest import SEED_SPEC, api_client

pytestmark = pytest.mark.django_db

START = 1_800_000_000.0  # a window boundary for 1-minute windows (a multiple of 60)


@pytest.fixture
def three_a_minute(monkeypatch):
    monkeypatch.setattr(SubmitThrottle, "THROTTLE_RATES", {"submit": "3/min"})


@pytest.fixture
def clock(monkeypatch):
    """The throttles' time, moved by the test."""
    now = SimpleNamespace(t=START)
    monkeypatch.setattr(SharedCacheThrottle, "timer", lambda self: now.t)
    return now


def attempt(user) -> tuple[bool, SubmitThrottle]:
    throttle = SubmitThrottle()
    return throttle.allow_request(SimpleNamespace(user=user), None), throttle


def submit_api(client):
    return client.post("/api/v1/jobs/", SEED_SPEC.replace("medium", "low") + "allow_duplicate: true\n",
                       content_type="application/yaml")


def test_the_api_answers_429_after_the_limit_naming_it(bob, demo_registered, three_a_minute):
    client = api_client(bob)
    codes = [submit_api(client).status_code for _ in range(4)]
    assert codes == [201, 201, 201, 429]
    response = submit_api(client)
    assert response.status_code == 429
    body = response.json()
    assert body["limit"] == "3/min"
    assert body["detail"].startswith("Request was throttled: the submit limit is 3/min. Expected available in ")
    assert 1 <= int(response["Retry-After"]) <= 60


def test_a_refused_request_is_not_counted(bob, three_a_minute, clock):
    assert [attempt(bob)[0] for _ in range(3)] == [True] * 3
    clock.t += 30
    assert [attempt(bob)[0] for _ in range(20)] == [False] * 20
    allowed, throttle = attempt(bob)
    assert throttle.wait() == pytest.approx(30)  # until the oldest of the three leaves the window
    clock.t += 30.01
    assert [attempt(bob)[0] for _ in range(4)] == [True, True, True, False], \
        "the refusals did not push the next allowance back"


def test_the_window_slides(bob, three_a_minute, clock):
    """Not fixed windows: three at the end of one minute and three more at the start of the next is six in
    two seconds, so the second three wait until the first three are a minute old."""
    clock.t += 59
    assert [attempt(bob)[0] for _ in range(3)] == [True] * 3
    clock.t += 2
    allowed, throttle = attempt(bob)
    assert not allowed and throttle.wait() == pytest.approx(58)
    clock.t += 57.9
    assert attempt(bob)[0] is False
    clock.t += 0.2
    assert attempt(bob)[0] is True


def test_wait_spreads_over_the_requests_left_as_drf_does(bob, three_a_minute, clock):
    assert attempt(bob)[0]
    clock.t += 10
    assert [attempt(bob)[0] for _ in range(2)] == [True, True]
    clock.t += 5
    allowed, throttle = attempt(bob)
    assert not allowed and throttle.wait() == pytest.approx(45)  # the first one leaves at 60 s


def test_users_are_counted_apart(bob, alice, three_a_minute, clock):
    assert [attempt(bob)[0] for _ in range(4)] == [True, True, True, False]
    assert attempt(alice)[0]


def test_the_log_lives_in_the_caches_redis_one_entry_per_counted_request(bob, redis_server, clock, three_a_minute):
    """Only counted requests are kept (at most the limit), and only for one period."""
    for _ in range(10):
        attempt(bob)
    server = redis.Redis.from_url(redis_server.url)
    keys = server.keys(f"*throttle_submit_{bob.pk}")
    assert len(keys) == 1
    assert server.zcard(keys[0]) == 3
    assert 55 < server.ttl(keys[0]) <= 60
    clock.t += 61
    assert attempt(bob)[0] and server.zcard(keys[0]) == 1  # the three expired ones dropped


def test_a_second_process_counts_against_the_same_limit(bob, redis_server, settings, three_a_minute):
    """Two web processes see one count: it lives in Redis, not in a process."""
    assert [attempt(bob)[0] for _ in range(2)] == [True, True]
    code = ("import django, json; django.setup()\n"
            "from types import SimpleNamespace\n"
            "from apps.accounts.throttles import SubmitThrottle\n"
            f"user = SimpleNamespace(pk={bob.pk}, is_authenticated=True)\n"
            "print(json.dumps([SubmitThrottle().allow_request(SimpleNamespace(user=user), None) for _ in range(2)]))\n")
    env = dict(os.environ, REDIS_URL=redis_server.url, DJANGO_SETTINGS_MODULE="yoloportal.settings",
               THROTTLE_SUBMIT="3/min")
    out = subprocess.run([sys.executable, "-c", code], cwd=settings.BASE_DIR, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [True, False]
    assert attempt(bob)[0] is False


def test_submits_go_through_when_the_caches_redis_is_down(bob, demo_registered, settings, three_a_minute):
    from asgiref.local import Local
    from django.core.cache import caches

    settings.CACHES = {"default": settings.CACHES["default"] | {"LOCATION": "redis://127.0.0.1:1/0"}}
    caches._connections = Local()
    client = api_client(bob)
    assert [submit_api(client).status_code for _ in range(4)] == [201] * 4
