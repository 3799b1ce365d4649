"""The scheduler process itself archives cold logs (apps/jobs/log_archive.py) on its
housekeeping thread, and keeps planning meanwhile."""

from __future__ import annotations

import pytest

from apps.jobs.models import Job, LogChunk
from tests.conftest import api_client
from tests.jobs.test_log_archive import job_with_logs

from .live import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_the_leading_scheduler_moves_cold_logs_into_storage(live, alice, teams):
    cold = job_with_logs(teams["vision"], alice, days_ago=40)
    hot = job_with_logs(teams["vision"], alice, days_ago=1)
    client = api_client(alice)
    before = client.get(f"/api/v1/jobs/{cold.pk}/logs/").content
    live.start_scheduler(LOG_HOT_DAYS="30", LOG_ARCHIVE_EVERY_S="1")
    wait_for(lambda: Job.objects.filter(pk=cold.pk).exclude(logs_key="").exists(), timeout=120,
             what="the cold job's logs to be archived")
    assert not LogChunk.objects.filter(job=cold).exists()
    assert LogChunk.objects.filter(job=hot).count() == 30
    assert client.get(f"/api/v1/jobs/{cold.pk}/logs/").content == before
    assert "Traceback" not in live.log("scheduler")
