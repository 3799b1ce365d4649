"""Continue a cancelled job with real parts: API → scheduler → gpu_worker → Ultralytics, twice.

The continuation's first attempt resumes the old job's newest stored checkpoint through the
worker's own resume path (worker/tasks.py): it trains only the epochs left, to the spec's end.
"""

from __future__ import annotations

import pytest

from apps.core.artifacts import artifact_path
from apps.jobs.models import Checkpoint, Job, JobEvent, JobState
from tests.conftest import SEED_SPEC, api_client

from .live import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.one_database, pytest.mark.django_db(transaction=True)]

EPOCHS = 8  # room for the epochs trained while the cancel reaches the worker


def state(job_id) -> str:
    return Job.objects.values_list("state", flat=True).get(pk=job_id)


def test_a_cancelled_job_continued_trains_only_the_epochs_left_and_succeeds(live, alice):
    live.start_scheduler()
    live.start_worker()
    client = api_client(alice)
    spec = SEED_SPEC.replace("epochs=2", f"epochs={EPOCHS}")
    old = client.post("/api/v1/jobs/", spec, content_type="application/yaml").json()["id"]
    stored = Checkpoint.objects.filter(job_id=old).exclude(key="")
    wait_for(stored.exists, timeout=240, what="the first stored checkpoint")
    assert client.post(f"/api/v1/jobs/{old}/cancel/").status_code == 202
    wait_for(lambda: state(old) == JobState.CANCELLED, timeout=60, what="the job to be cancelled")
    epoch = stored.order_by("-epoch").first().epoch
    assert epoch < EPOCHS, "cancelled too late: nothing left to continue"
    print(f"cancelled after the checkpoint of epoch {epoch} of {EPOCHS}")

    response = client.post(f"/api/v1/jobs/{old}/continue/", {"timeout": 1800}, format="json")

    assert response.status_code == 201, response.content
    new = response.json()["id"]
    assert response.json()["spec"]["continued_from"]["epoch"] == epoch
    wait_for(lambda: state(new) in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMED_OUT),
             timeout=300, what="the continued job to finish")
    job = Job.objects.get(pk=new)
    assert job.state == JobState.SUCCEEDED, job.error
    assert job.attempt == 1 and job.timeout_s == 1800 and job.epochs_done == EPOCHS
    started = JobEvent.objects.get(job_id=new, kind="training_started", attempt=1)
    assert started.data["start_epoch"] == epoch + 1  # the old job's epochs are not trained again
    assert JobEvent.objects.filter(job_id=new, kind="resuming", message__contains=f"epoch {epoch}").exists()
    # Its curves are whole: the old job's epochs 1..N (attempt 0: inherited), then its own.
    metrics = client.get(f"/api/v1/jobs/{new}/metrics/").json()["results"]
    assert [(m["epoch"], m["attempt"]) for m in metrics] == [(e, 0 if e <= epoch else 1) for e in range(1, EPOCHS + 1)]
    assert job.spec["train_args"]["data"] == "demo:v1"  # the version the old job trained on
    assert artifact_path(job.weights_path).is_file()
    # Its run folder starts without best.pt: the old run's is put back, so the weights are the
    # better of both runs' (worker/checkpoint_store.py best_restore), not last.pt by default.
    assert f"job {new}: best.pt restored from the checkpoint of epoch" in live.log("worker")
