"""/healthz and /readyz: what a load balancer or a Kubernetes probe asks, over plain HTTP to a pod IP."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.portal.liveweb import free_port

pytestmark = pytest.mark.django_db

# A kubelet probes the pod's IP: a host ALLOWED_HOSTS does not list, over HTTP.
PROBE = {"HTTP_HOST": "10.1.2.3:8000"}


@pytest.fixture
def secure(settings):
    settings.ALLOWED_HOSTS = ["portal.example.com"]
    settings.SECURE_SSL_REDIRECT = True
    return settings


def test_healthz_answers_a_probe_the_host_check_and_https_redirect_would_refuse(secure, redis_server):
    client = Client()
    assert client.get("/jobs/", **PROBE).status_code == 400  # any other path: the host check refuses it
    response = client.get("/healthz", **PROBE)
    assert (response.status_code, response.json()) == (200, {"status": "ok"})
    response = client.get("/readyz", **PROBE)
    assert (response.status_code, response.json()) == (200, {"status": "ok", "database": "ok", "redis": "ok"})


def test_readyz_is_503_naming_what_is_down_when_redis_is_gone(settings, redis_server):
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    client = Client()
    response = client.get("/readyz")
    assert (response.status_code, response.json()) == (503, {"status": "down", "database": "ok", "redis": "down"})
    assert client.get("/healthz").status_code == 200  # alive, only not ready
    assert client.post("/readyz").status_code == 405


@pytest.fixture
def unapplied_migration(monkeypatch):
    """The database as `manage.py migrate` would find it after a deploy: a migration not applied
    (its django_migrations row gone, undone with the test's transaction), and this process's
    earlier "migrated" answer forgotten."""
    from django.db import connection

    from apps.core import migrated

    monkeypatch.setattr(migrated, "_migrated", False)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM django_migrations WHERE app = 'jobs'")


def test_readyz_is_503_not_migrated_while_a_migration_is_left_to_apply(unapplied_migration, redis_server):
    response = Client().get("/readyz")
    assert (response.status_code, response.json()) == (
        503, {"status": "down", "database": "not migrated", "redis": "ok"})


def test_readyz_keeps_its_migrated_answer_for_the_process(redis_server, monkeypatch):
    """The migration plan is built once: a later probe costs SELECT 1 and PING only."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from apps.core import migrated

    monkeypatch.setattr(migrated, "_migrated", False)
    assert Client().get("/readyz").status_code == 200
    with CaptureQueriesContext(connection) as queries:
        assert Client().get("/readyz").status_code == 200
    assert [q["sql"] for q in queries.captured_queries] == ["SELECT 1"]
