"""Runtime estimates on a small installation: tiny jobs are mostly fixed overhead (process
start, imports, dataset scan, final validation, upload), which the estimate must not scale
away (trial 18, P7: ~5 s predicted for a 40-epoch job that took ~30 s)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.datasets.models import Dataset
from apps.jobs.models import Job, JobState, MetricPoint
from apps.jobs.services import job_submit
from apps.jobs.spec import parse_spec
from apps.quotas.models import UsageRecord
from apps.scheduling.estimates import fitted_model_forget
from apps.scheduling.inputs import cluster_state

pytestmark = pytest.mark.django_db

START_S, END_S = 12.0, 8.0  # before the first epoch, after the last one (a CPU demo worker)


def per_epoch(images: int, imgsz: int) -> float:
    """An epoch's seconds on the demo worker: a fixed part (dataloader, validation) plus the images."""
    return 0.15 + 0.02 * images * (imgsz / 640) ** 2


def actual(epochs: int, images: int, imgsz: int) -> float:
    return START_S + epochs * per_epoch(images, imgsz) + END_S


@pytest.fixture
def datasets(teams, demo_registered):
    """``demo`` with 16 training images, ``big`` (the same files) counted as 128."""
    from apps.datasets.services import dataset_register

    dataset_register(team=teams["vision"], name="big", yaml_path=demo_registered)
    Dataset.objects.filter(team=teams["vision"], name="demo").update(num_images=16)
    Dataset.objects.filter(team=teams["vision"], name="big").update(num_images=128)
    fitted_model_forget()
    yield
    fitted_model_forget()


def submit(user, *, epochs: int, data: str = "demo", imgsz: int = 64):
    document = {"task_name": f"t{epochs}", "timeout": 7200, "allow_duplicate": True,
                "command": f"yolo train data={data} model=yolov8n.yaml epochs={epochs} imgsz={imgsz}"}
    job, _ = job_submit(user=user, spec=parse_spec(document))
    return job


def finish(job, *, epochs: int, images: int, imgsz: int, ended_ago_s: float = 600.0) -> None:
    """Succeeded ``ended_ago_s`` ago after ``actual()`` seconds, one metric point per epoch at its end."""
    end = timezone.now() - timedelta(seconds=ended_ago_s)
    runtime = actual(epochs, images, imgsz)
    started = end - timedelta(seconds=runtime)
    Job.objects.filter(pk=job.pk).update(state=JobState.SUCCEEDED, started_at=started, finished_at=end,
                                         epochs_done=epochs)
    for epoch in range(1, epochs + 1):
        point = MetricPoint.objects.create(job=job, epoch=epoch, attempt=1, seq=epoch, values={})
        at = started + timedelta(seconds=START_S + epoch * per_epoch(images, imgsz))
        MetricPoint.objects.filter(pk=point.pk).update(created_at=at)
    UsageRecord.objects.create(job=job, team=job.team, user=job.user, attempt=1, priority_class="medium",
                               gpu_seconds=runtime * job.gpus, started_at=started, ended_at=end)


# A dozen tiny jobs of other shapes: mostly on the bigger dataset at larger image sizes.
LEDGER = [(3, "big", 320), (5, "big", 320), (10, "big", 320), (30, "big", 320), (8, "big", 640), (12, "big", 640),
          (3, "big", 640), (50, "big", 320), (6, "big", 160), (25, "big", 320), (20, "big", 160), (5, "demo", 64)]
IMAGES = {"demo": 16, "big": 128}


def ledger(user) -> None:
    for epochs, data, imgsz in LEDGER:
        finish(submit(user, epochs=epochs, data=data, imgsz=imgsz), epochs=epochs, images=IMAGES[data], imgsz=imgsz)


def test_a_40_epoch_tiny_job_is_estimated_near_what_it_takes_not_scaled_below_its_overhead(alice, datasets, node):
    """A dozen finished tiny jobs of other shapes: the new 40-epoch job (26 s) is estimated
    within a factor 1.5, and above its 5-epoch twin's runtime (the old fit said ~10 s); so
    is one at an image size no job ran at (by the fitted per-epoch time)."""
    ledger(alice)
    twin, unseen = submit(alice, epochs=40), submit(alice, epochs=40, imgsz=96)  # no job ran at 96 yet
    state, _ = cluster_state()
    walltimes = {j.job_id: j.walltime_s for j in state.queued}
    for job, expected in ((twin, actual(40, 16, 64)), (unseen, actual(40, 16, 96))):
        assert expected / 1.5 <= walltimes[str(job.pk)] <= expected * 1.5
    assert walltimes[str(twin.pk)] > actual(5, 16, 64)


def test_a_running_job_ends_at_its_rate_between_epochs_plus_the_usual_time_after_the_last(alice, datasets, node):
    """Two epochs done 14 s after the start (12 s of it start-up): 38 epochs × 0.15 s + 8 s of
    final validation and upload are left, not 38 × 7 s (the start-up counted as epochs)."""
    ledger(alice)
    job = submit(alice, epochs=40)
    now = timezone.now()
    started = now - timedelta(seconds=START_S + 2 * per_epoch(16, 64) + 0.5)
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING, node=node, gpu_indices=[0], started_at=started,
                                         epochs_done=2)
    for epoch in (1, 2):
        point = MetricPoint.objects.create(job=job, epoch=epoch, attempt=1, seq=epoch, values={})
        at = started + timedelta(seconds=START_S + epoch * per_epoch(16, 64))
        MetricPoint.objects.filter(pk=point.pk).update(created_at=at)
    state, _ = cluster_state(now)
    (running,) = state.running
    left = 38 * per_epoch(16, 64) + END_S
    assert left / 1.5 <= running.expected_end - now.timestamp() <= left * 1.5


def test_a_running_job_one_slow_epoch_in_ends_near_its_shapes_rate_not_that_epochs(alice, datasets, node):
    """One epoch done 5 s later than its shape's start-up and epoch (dataloader warm-up, caching):
    ~39 × 0.15 s + 8 s are left, not 39 × 5.15 s + 8 s (~209 s, the ETAs behind it on `make run`
    for one pass)."""
    ledger(alice)
    job = submit(alice, epochs=40)
    now = timezone.now()
    first_epoch_end = START_S + 5.0 + per_epoch(16, 64)
    started = now - timedelta(seconds=first_epoch_end + 0.5)
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING, node=node, gpu_indices=[0], started_at=started,
                                         epochs_done=1)
    point = MetricPoint.objects.create(job=job, epoch=1, attempt=1, seq=1, values={})
    MetricPoint.objects.filter(pk=point.pk).update(created_at=started + timedelta(seconds=first_epoch_end))
    state, _ = cluster_state(now)
    (running,) = state.running
    left = 39 * per_epoch(16, 64) + END_S
    assert left / 1.5 <= running.expected_end - now.timestamp() <= left * 1.5


def test_identical_jobs_queued_on_one_gpu_get_etas_one_runtime_apart(alice, datasets):
    """Four identical 40-epoch jobs on one GPU: the first runs, the other three are expected
    to start one after another, about one runtime (26 s) apart — not a few seconds."""
    from apps.scheduling.loop import plan_and_start
    from worker.inventory import simulated_gpus
    from worker.node import register_this_host

    register_this_host(name="one-gpu", gpus=simulated_gpus(1))
    ledger(alice)
    jobs = [submit(alice, epochs=40) for _ in range(4)]
    plan_and_start()
    for job in jobs:
        job.refresh_from_db()
    assert jobs[0].state == JobState.STARTING
    assert all(j.state == JobState.QUEUED for j in jobs[1:])
    etas = [j.estimated_start_at for j in jobs[1:]]
    runtime = actual(40, 16, 64)
    now = timezone.now()
    assert runtime / 1.5 <= (etas[0] - now).total_seconds() <= runtime * 1.5
    for earlier, later in zip(etas, etas[1:], strict=False):
        assert runtime / 1.5 <= (later - earlier).total_seconds() <= runtime * 1.5
    assert all(j.estimated_start_high_at >= j.estimated_start_at for j in jobs[1:])
