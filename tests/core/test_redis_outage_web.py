"""A Redis outage in a web process: one WARNING saying what still works and one INFO when a later
request reaches Redis again, however many requests meet it; submits are still stored (201).

Before, each submit logged "throttle cache unavailable" and "could not kick the scheduler": two
WARNINGs per request for as long as the outage lasted, and nothing when it ended."""

from __future__ import annotations

import logging
import time

import pytest

from apps.jobs.models import Job, JobState
from apps.scheduling import kick
from tests.conftest import SEED_SPEC, api_client

pytestmark = pytest.mark.django_db
SUBMITS = 5
DOWN, BACK = "Redis unreachable at", "Redis reachable again at"


def submit(client, django_capture_on_commit_callbacks) -> int:
    """POST /jobs/ and wait for the kick its commit asks of this process's kicker thread."""
    sent = kick._kicker.sent
    with django_capture_on_commit_callbacks(execute=True):
        status = client.post("/api/v1/jobs/", SEED_SPEC.replace("medium", "low") + "allow_duplicate: true\n",
                             content_type="application/yaml").status_code
    deadline = time.monotonic() + 10
    while kick._kicker.sent == sent and time.monotonic() < deadline:
        time.sleep(0.01)
    assert kick._kicker.sent > sent, "the submit's kick was never tried"
    return status


def test_many_submits_during_an_outage_are_one_warning_and_one_line_when_back(
        own_redis, bob, demo_registered, caplog, django_capture_on_commit_callbacks):
    client = api_client(bob)
    assert submit(client, django_capture_on_commit_callbacks) == 201  # Redis up: nothing to say
    own_redis.kill()
    with caplog.at_level(logging.INFO):
        during = [submit(client, django_capture_on_commit_callbacks) for _ in range(SUBMITS)]
        alarms = [r for r in caplog.records if r.levelno >= logging.WARNING]
        own_redis.start()
        after = submit(client, django_capture_on_commit_callbacks)
    assert during == [201] * SUBMITS, "a submit does not need Redis: stored and answered"
    assert Job.objects.filter(user=bob, state=JobState.QUEUED).count() == SUBMITS + 2
    assert [r.getMessage()[:len(DOWN)] for r in alarms] == [DOWN], [r.getMessage() for r in alarms]
    assert "submits and cancels are still stored" in alarms[0].getMessage()
    assert "rate limits are not enforced" in alarms[0].getMessage()
    assert after == 201
    logged = [(r.levelname, r.getMessage()) for r in caplog.records if r.levelno >= logging.INFO
              and r.name == "yoloportal.redis" or r.levelno >= logging.WARNING]
    assert [level for level, _ in logged] == ["WARNING", "INFO"], logged
    assert logged[1][1].startswith(BACK), logged


@pytest.mark.parametrize("module", ["yoloportal.asgi", "yoloportal.wsgi"])
def test_either_web_entry_point_says_what_still_works(module):
    """A web process served through WSGI (gunicorn's sync workers, mod_wsgi) warns as the ASGI one does;
    without it the WARNING said nothing of what still works."""
    import subprocess
    import sys

    check = (f"import {module}\nfrom apps.core import redis_outage as r\n"
             "print(r._goes_on == r.WEB_CONSEQUENCE)")
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "True", out.stderr[-2000:]
