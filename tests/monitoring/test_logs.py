"""LOG_FORMAT=json: one JSON object per line, with request id, job id, attempt and node."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from tests.conftest import api_client
from tests.jobs.factories import make_job
from yoloportal.logs import ContextFilter, JsonFormatter, log_context


@pytest.fixture
def json_log():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(ContextFilter())
    root = logging.getLogger()
    root.addHandler(handler)
    yield lambda: [json.loads(line) for line in stream.getvalue().splitlines()]
    root.removeHandler(handler)


def test_bound_context_and_extra_fields_are_json_fields(json_log):
    log = logging.getLogger("yoloportal.test")
    with log_context(job_id="j-1", attempt=2, node="gpu-a"):
        log.warning("training %s", "started")
        log.warning("override", extra={"node": "gpu-b"})
    log.warning("outside")
    first, second, third = json_log()
    assert first["message"] == "training started" and first["level"] == "WARNING"
    assert (first["job_id"], first["attempt"], first["node"]) == ("j-1", 2, "gpu-a")
    assert second["node"] == "gpu-b"
    assert "job_id" not in third


@pytest.mark.django_db
def test_a_request_id_is_minted_echoed_and_logged(json_log, bob):
    client = api_client(bob)
    response = client.post("/api/v1/jobs/", "task_name: [unclosed", content_type="application/yaml",
                           HTTP_X_REQUEST_ID="req-from-proxy-123")
    assert response.status_code == 400 and response["X-Request-ID"] == "req-from-proxy-123"
    [line] = [e for e in json_log() if e["logger"] == "django.request"]
    assert line["request_id"] == "req-from-proxy-123"
    minted = client.get("/api/v1/jobs/", HTTP_X_REQUEST_ID="bad id with spaces")["X-Request-ID"]
    assert len(minted) == 32 and " " not in minted


def test_log_format_is_checked(tmp_path):
    result = subprocess.run([sys.executable, "manage.py", "check"], cwd=settings.BASE_DIR, capture_output=True,
                            text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "LOG_FORMAT": "xml",
                                                        "DATA_DIR": str(tmp_path)})
    assert result.returncode != 0 and "LOG_FORMAT" in result.stderr


@pytest.mark.django_db(transaction=True)
def test_the_scheduler_process_logs_json_with_job_attempt_and_node(teams, bob, node, redis_server):
    from tests.integration.live import LiveSystem

    node.last_heartbeat = timezone.now() - timedelta(hours=1)
    node.save(update_fields=["last_heartbeat"])
    job = make_job(team=teams["vision"], user=bob, state="running", node=node, gpu_indices=[0],
                   started_at=timezone.now() - timedelta(hours=2))
    env = LiveSystem(settings.DATA_DIR, redis_server.url).env(LOG_FORMAT="json")
    result = subprocess.run([sys.executable, "manage.py", "scheduler", "--once"], cwd=settings.BASE_DIR, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stderr.splitlines() if line.strip()]
    [ended] = [e for e in lines if e.get("job_id") == str(job.pk)]
    assert (ended["attempt"], ended["node"], ended["component"]) == (1, "node-a", "scheduler")
    assert any(e.get("node") == "node-a" and "lost" in e["message"] for e in lines)


@pytest.mark.django_db
def test_an_admin_403_is_one_line_without_a_traceback(json_log, manager):
    """Trial 14, F8: each 403 a manager met in admin wrote ~40 lines of traceback."""
    from tests.conftest import admin_client

    assert admin_client(manager).get("/admin/auth/user/").status_code == 403
    [line] = [e for e in json_log() if e["logger"] == "django.request"]
    assert line["message"] == "Forbidden (Permission denied): /admin/auth/user/"
    assert "exception" not in line
