"""The fair policy on the live system: preemption by an urgent job and by a shorter job of the
same class, resume from checkpoint, and the reason an over-quota user is shown."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.jobs.models import TERMINAL_STATES, Checkpoint, Job, JobEvent, JobState, MetricPoint
from apps.quotas.models import UsageRecord
from apps.scheduling.models import SchedulerConfig
from tests.conftest import SEED_SPEC, api_client

from .live import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


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


def used_yesterday(user, team: str, gpu_hours: float) -> None:
    """``user`` finished a job that used ``gpu_hours`` GPU-hours within the last 24 h."""
    document = spec("earlier-run", 1, "low").replace("user: vision", f"user: {team}")
    job_id = api_client(user).post("/api/v1/jobs/", document, content_type="application/yaml").json()["id"]
    end = timezone.now() - timedelta(minutes=10)
    start = end - timedelta(hours=gpu_hours)
    Job.objects.filter(pk=job_id).update(state=JobState.SUCCEEDED, started_at=start, finished_at=end)
    job = Job.objects.get(pk=job_id)
    UsageRecord.objects.create(job=job, team=job.team, user=user, attempt=1, priority_class="low",
                               gpu_seconds=gpu_hours * 3600, started_at=start, ended_at=end)


@pytest.mark.one_database
def test_a_short_job_preempts_a_long_one_of_its_class_which_stops_at_an_epoch_end_and_resumes(
    live, alice, bob, carol
):
    """Size-aware preemption on the live system: both low; the long job (by its own epoch rate)
    has far more time left than the short one needs. On the way, a user past the daily quota
    is told what that means for the job they submit while the GPU is busy."""
    config = SchedulerConfig.current()
    config.preempt_min_runtime_s = 0
    config.size_preemption = True
    config.user_gpu_hours_per_day = 20
    config.save()
    used_yesterday(carol, "robotics", 21)  # before the scheduler runs, so it never starts that job
    live.start_scheduler()
    live.start_worker(gpus=1)

    # Preempting it must be worth it on any machine: its remaining time (epochs left × its own
    # seconds per epoch so far) must exceed the restart cost (120 s) + 16 × the short job's 5 s.
    # With 40 epochs that held only while its first, slow epoch dominated the rate: on a loaded
    # machine the pass came a few epochs later and the long job just ran to the end. With 1000,
    # any rate above 0.2 s per epoch qualifies; it is cancelled once it has resumed.
    long_id = api_client(bob).post("/api/v1/jobs/", spec("long-run", 1000, "low"), content_type="application/yaml").json()["id"]
    wait_for(lambda: Checkpoint.objects.filter(job_id=long_id).exists(), 180, what="the long job's first checkpoint")

    # carol is past the daily quota: her job waits as over-quota work, and the API says so.
    document = spec("over-quota", 1, "low").replace("user: vision", "user: robotics")
    over_id = api_client(carol).post("/api/v1/jobs/", document, content_type="application/yaml").json()["id"]
    wait_for(lambda: api_client(carol).get(f"/api/v1/jobs/{over_id}/").json()["reason"].startswith("over quota"), 60,
             what="the over-quota reason")
    shown = api_client(carol).get(f"/api/v1/jobs/{over_id}/").json()
    assert shown["state"] == JobState.QUEUED
    assert shown["reason"].startswith("over quota: runs when GPUs are idle, may be preempted (21 of 20 GPU-hours")
    api_client(carol).post(f"/api/v1/jobs/{over_id}/cancel/")  # the preemption below is the point

    short_spec = spec("quick-check", 1, "low") + "expected_duration: 5\n"
    short_id = api_client(alice).post("/api/v1/jobs/", short_spec, content_type="application/yaml").json()["id"]
    wait_for(lambda: Job.objects.get(pk=short_id).state in TERMINAL_STATES, 180, what="the short job")
    wait_for(lambda: JobEvent.objects.filter(job_id=long_id, kind="training_started", attempt=2).exists(), 180,
             what="the long job's second attempt")
    api_client(bob).post(f"/api/v1/jobs/{long_id}/cancel/")  # the rest of its 40 epochs is not the point
    wait_for(lambda: Job.objects.get(pk=long_id).state in TERMINAL_STATES, 120, what="the long job to stop")

    assert Job.objects.get(pk=short_id).state == JobState.SUCCEEDED
    preempted = JobEvent.objects.get(job_id=long_id, kind="preempted")
    assert "far less GPU time" in preempted.message and preempted.data["grace_s"] > 0
    # Asked to stop at its epoch end, it stopped there; the next attempt starts at the epoch
    # after it (no completed epoch lost) and every epoch is stored exactly once.
    stopped = JobEvent.objects.get(job_id=long_id, kind="stopped_at_epoch_end")
    resumed = JobEvent.objects.get(job_id=long_id, kind="training_started", attempt=2)
    assert resumed.data["start_epoch"] == stopped.data["epoch"] + 1
    epochs = list(MetricPoint.objects.filter(job_id=long_id).order_by("epoch").values_list("epoch", flat=True))
    assert epochs == list(range(1, len(epochs) + 1)) and len(epochs) >= stopped.data["epoch"]
    attempt_stopped = JobEvent.objects.get(job_id=long_id, kind="attempt_stopped", attempt=1).created_at
    assert JobEvent.objects.get(job_id=short_id, kind="training_started").created_at >= attempt_stopped


@pytest.mark.one_database
def test_a_drained_job_started_on_another_node_waits_for_its_epoch_end_and_resumes_after_it(live, alice, bob):
    """review22, 4: evacuated from a drained node (a graceful preemption), the job is placed on the
    other node and may start there before the victim has stopped. It chooses its checkpoint only
    once the victim has reported its stop, so the epoch the victim finished after its requeue is
    recorded and resumed from, not refused and trained again."""
    from apps.cluster.services import node_drain
    from apps.jobs.services import job_evacuate

    live.start_scheduler()
    live.start_worker("worker-a", node="node-a", gpus=1)
    live.start_worker("worker-b", node="node-b", gpus=1)
    job_id = api_client(bob).post("/api/v1/jobs/", spec("drained", 1000, "low"),
                                  content_type="application/yaml").json()["id"]
    wait_for(lambda: Checkpoint.objects.filter(job_id=job_id).exists(), 180, what="the job's first checkpoint")
    job = Job.objects.select_related("node", "team").get(pk=job_id)
    first_node = job.node.name
    assert node_drain(node=job.node, reason="disk swap")
    assert job_evacuate(job, node_name=first_node, reason="disk swap", by=alice)
    wait_for(lambda: JobEvent.objects.filter(job_id=job_id, kind="training_started", attempt=2).exists(), 180,
             what="the job's second attempt")
    api_client(bob).post(f"/api/v1/jobs/{job_id}/cancel/")  # the rest of its epochs is not the point
    wait_for(lambda: Job.objects.get(pk=job_id).state in TERMINAL_STATES, 120, what="the job to stop")

    events = JobEvent.objects.filter(job_id=job_id)
    assert events.get(kind="running", attempt=2).message.startswith("running on node-")
    assert first_node not in events.get(kind="running", attempt=2).message
    stopped = events.get(kind="stopped_at_epoch_end", attempt=1)
    resumed = events.get(kind="training_started", attempt=2)
    assert resumed.data["start_epoch"] == stopped.data["epoch"] + 1
    assert not events.filter(kind="previous_attempt_silent").exists()
    epochs = list(MetricPoint.objects.filter(job_id=job_id).order_by("epoch").values_list("epoch", flat=True))
    assert epochs == list(range(1, len(epochs) + 1)) and len(epochs) >= stopped.data["epoch"]
    # When the second attempt ran before the victim had stopped (the case this is about), it waited.
    victim_done = events.get(kind="attempt_stopped", attempt=1).created_at
    if events.get(kind="running", attempt=2).created_at < victim_done:
        assert events.filter(kind="waiting_for_previous_attempt", attempt=2).exists()
        assert resumed.created_at >= victim_done
    print("second attempt running at", events.get(kind="running", attempt=2).created_at, "victim stopped at",
          victim_done, "resumed from epoch", stopped.data["epoch"])
