"""/metrics on the live system: real web, scheduler and worker processes, real training."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from django.conf import settings
from prometheus_client.parser import text_string_to_metric_families

from apps.jobs.models import Job, JobState
from tests.conftest import SEED_SPEC, api_client
from tests.monitoring.tools import run
from tests.portal.liveweb import WebServer

from .live import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
TOKEN = "scrape-me"


def scrape(url: str, token: str | None = TOKEN) -> str:
    request = urllib.request.Request(url + "/metrics",
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.read().decode()


def test_a_live_scrape_sees_the_scheduler_the_worker_and_training_and_promtool_finds_it_clean(
        live, alice, monkeypatch):
    """Two one-GPU jobs on a one-GPU node: the second waits, so its start measures dispatch latency."""
    monkeypatch.setenv("METRICS_TOKEN", TOKEN)  # the web process's environment
    web = WebServer(live, live.log_dir)
    try:
        live.start_scheduler(LOG_FORMAT="json")
        live.start_worker(LOG_FORMAT="json")
        with pytest.raises(urllib.error.HTTPError) as refused:
            scrape(web.url, token=None)
        assert refused.value.code == 401

        client = api_client(alice)
        spec = SEED_SPEC.replace("epochs=2 imgsz=128", "epochs=1 imgsz=64") + "allow_duplicate: true\n"
        ids = [client.post("/api/v1/jobs/", spec, content_type="application/yaml").json()["id"] for _ in range(2)]
        wait_for(lambda: set(Job.objects.filter(pk__in=ids).values_list("state", flat=True)) == {JobState.SUCCEEDED},
                 timeout=400, interval=0.5, what="both jobs to succeed")

        text = scrape(web.url)
        artifacts = Path(settings.BASE_DIR) / "test-artifacts"
        artifacts.mkdir(exist_ok=True)
        (artifacts / "live-scrape.txt").write_text(text)  # for the docs and the closing note
        values = {(s.name, tuple(sorted(s.labels.items()))): s.value
                  for family in text_string_to_metric_families(text) for s in family.samples}
        assert values[("yoloportal_jobs_finished_total", (("outcome", "succeeded"),))] == 2
        assert values[("yoloportal_redis_up", ())] == 1
        assert values[("yoloportal_node_up", (("node", "node-a"),))] == 1
        assert values[("yoloportal_scheduler_pass_duration_seconds_count", ())] >= 1
        assert values[("yoloportal_scheduler_last_pass_timestamp_seconds", ())] > 0
        assert values[("yoloportal_dispatch_latency_seconds_count", ())] == 1
        assert values[("yoloportal_gpu_seconds_charged_total", (("team", "vision"),))] > 0
        assert values[("yoloportal_job_wait_seconds_count", (("class", "medium"),))] == 2

        # Structured logs: the work-horses' lines carry the job, its attempt and the node.
        lines = [json.loads(line) for line in live.log("worker").splitlines() if line.startswith("{")]
        assert {(e.get("job_id"), e.get("attempt"), e.get("node")) for e in lines} >= {(i, 1, "node-a") for i in ids}
        assert all(e.get("component") for e in lines if e["logger"].startswith("rq."))

        result = run("promtool", "check", "metrics", stdin=text.encode())
        assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), (
            (result.stdout + result.stderr).decode())
    finally:
        web.stop()
