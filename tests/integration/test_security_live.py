"""Security findings checked on the live system: real scheduler, gpu_worker and training children."""

from __future__ import annotations

import pytest
from django.conf import settings

from apps.jobs.models import Job, JobState
from tests.conftest import SEED_SPEC, api_client

from .live import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

TERMINAL = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMED_OUT)


def submit(client, *, name: str, data: str = "demo", epochs: int = 1) -> str:
    spec = (SEED_SPEC.replace("yolo-v8s-industrial-inspection", name)
            .replace("data=demo", f"data={data}").replace("epochs=2 imgsz=128", f"epochs={epochs} imgsz=64"))
    response = client.post("/api/v1/jobs/", spec, content_type="application/yaml")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def finished(job_id: str) -> bool:
    return Job.objects.values_list("state", flat=True).get(pk=job_id) in TERMINAL


def everything_a_member_reads(client, job_id: str) -> str:
    return "".join(client.get(f"/api/v1/jobs/{job_id}/{tail}").content.decode()
                   for tail in ("", "events/", "logs/", "metrics/"))


def test_a_failed_and_a_succeeded_job_show_no_server_paths(live, alice):
    """Finding 8 end to end: a real Ultralytics failure (missing images) and a real success."""
    broken = settings.DATASETS_DIR / "vision" / "broken"
    broken.mkdir(parents=True, exist_ok=True)
    (broken / "data.yaml").write_text("train: images/train\nval: images/val\nnames: [a]\n")
    live.start_scheduler()
    live.start_worker()
    client = api_client(alice)
    good = submit(client, name="fine")
    bad = submit(client, name="broken", data="broken/data.yaml")
    wait_for(lambda: finished(good) and finished(bad), 240, what="both jobs to finish")

    failed = client.get(f"/api/v1/jobs/{bad}/").json()
    assert failed["state"] == "failed", failed
    assert "Traceback" not in failed["error"] and 'File "' not in failed["error"], failed["error"]
    assert "broken/" in failed["error"] or "images" in failed["error"], failed["error"]
    assert client.get(f"/api/v1/jobs/{good}/").json()["state"] == "succeeded"
    for job_id in (good, bad):
        text = everything_a_member_reads(client, job_id)
        for root in (settings.DATA_DIR, settings.BASE_DIR, settings.DATASETS_DIR, settings.JOBS_DIR):
            assert str(root) not in text, f"{root} leaks: …{text[max(text.find(str(root)) - 200, 0):][:500]}"
        assert "site-packages" not in text  # the virtualenv's paths (tracebacks in the log) are cut too
