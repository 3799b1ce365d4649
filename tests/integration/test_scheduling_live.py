"""The fair policy on the live system: preemption by an urgent job, resume from checkpoint."""

from __future__ import annotations

import pytest

from apps.jobs.models import TERMINAL_STATES, Checkpoint, Job, JobEvent, JobState, MetricPoint
from apps.scheduling.models import SchedulerConfig
from tests.conftest import SEED_SPEC, api_client

from .live import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def spec(name: str, epochs: int, priority: str) -> str:
    return (SEED_SPEC.replace("yolo-v8s-industrial-inspection", name)
            .replace("epochs=2", f"epochs={epochs}").replace("priority: medium", f"priority: {priority}"))


def test_an_urgent_job_preempts_a_low_job_which_resumes_from_its_checkpoint(live, alice, bob):
    config = SchedulerConfig.current()
    config.preempt_min_runtime_s = 0
    config.save()
    live.start_scheduler()
    live.start_worker(gpus=1)

    low = api_client(bob).post("/api/v1/jobs/", spec("background", 6, "low"), content_type="application/yaml")
    low_id = low.json()["id"]
    wait_for(lambda: Checkpoint.objects.filter(job_id=low_id).exists(), 180, what="the low job's first checkpoint")

    urgent = api_client(alice).post("/api/v1/jobs/", spec("hotfix", 1, "urgent"), content_type="application/yaml")
    urgent_id = urgent.json()["id"]
    wait_for(lambda: Job.objects.get(pk=urgent_id).state in TERMINAL_STATES, 180, what="the urgent job")
    wait_for(lambda: Job.objects.get(pk=low_id).state in TERMINAL_STATES, 240, what="the preempted job")

    low_job, urgent_job = Job.objects.get(pk=low_id), Job.objects.get(pk=urgent_id)
    assert urgent_job.state == JobState.SUCCEEDED and urgent_job.run_class == "urgent"
    assert low_job.state == JobState.SUCCEEDED, low_job.error
    preempted = JobEvent.objects.get(job_id=low_id, kind="preempted")
    assert "hotfix" in preempted.message or urgent_id in preempted.message or "urgent" in preempted.message
    assert low_job.attempt == 2 and low_job.retries_left == 0
    resumed = JobEvent.objects.get(job_id=low_id, kind="training_started", attempt=2)
    assert resumed.data["start_epoch"] >= 2
    assert sorted(MetricPoint.objects.filter(job_id=low_id).values_list("epoch", flat=True)) == [1, 2, 3, 4, 5, 6]
    urgent_ran = JobEvent.objects.get(job_id=urgent_id, kind="running").created_at
    assert preempted.created_at <= urgent_ran
    # The urgent job trained only once the preempted attempt's processes were gone (GPU locks).
    stopped = JobEvent.objects.get(job_id=low_id, kind="attempt_stopped", attempt=1).created_at
    assert JobEvent.objects.get(job_id=urgent_id, kind="training_started").created_at >= stopped
