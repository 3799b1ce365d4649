"""Security findings checked on the live system: real scheduler, gpu_worker and training children."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.conf import settings

from apps.jobs.models import Job, JobState
from tests.conftest import SEED_SPEC, api_client

from .live import training_processes, wait_for
from .test_faults import zygote_pids

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


def environment_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def test_a_failed_and_a_succeeded_job_show_no_server_paths(live, alice):
    """Finding 8 end to end: a real Ultralytics failure (missing images) and a real success.
    Finding 10 on the way: the training process's environment holds none of the worker's secrets."""
    broken = settings.DATASETS_DIR / "vision" / "broken"
    broken.mkdir(parents=True, exist_ok=True)
    (broken / "data.yaml").write_text("train: images/train\nval: images/val\nnames: [a]\n")
    live.start_scheduler()
    live.start_worker(SECRET_KEY="worker-secret-key-for-the-test")
    wait_for(lambda: "zygote ready" in live.log("worker"), 90, what="the zygote to preload")
    client = api_client(alice)
    good = submit(client, name="fine", epochs=3)
    pids = wait_for(lambda: training_processes().get(good), 120, interval=0.05, what="the training process")
    # The zygote the child was forked from holds no secrets either (a child can read its
    # /proc/<pid>/environ: same user). The worker's own environment is still readable by the
    # same user — docs/security.md says so; a separate user comes with the isolation issue.
    for pid in [*pids, *zygote_pids()]:
        leaked = {"SECRET_KEY", "DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE"} & set(environment_of(pid))
        assert not leaked, f"process {pid} inherited {leaked}"
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
