"""Sweeps on the live system: real Redis, scheduler and worker processes.

The trials run the fast trainer (worker/fast_child.py: the real event contract, checkpoints
and weights files, a metric that depends on lr0) except in the last test, which trains with
Ultralytics. Each asserts what the sweep promises: no trial lost or duplicated when the
scheduler dies mid-sweep, a lagging trial stopped at the epoch the pruner names, a cancelled
sweep taking its trials with it, the best weights registered with the sweep as lineage.
"""

from __future__ import annotations

import time

import pytest

from apps.jobs.models import ACTIVE_STATES, TERMINAL_STATES, Job, JobEvent, JobState, MetricPoint
from apps.jobs.services import job_submit
from apps.jobs.spec import parse_spec
from apps.registry.models import ModelVersion
from apps.sweeps.models import Trial
from tests.conftest import api_client

from .live import InvariantWatch, fast_trainer, wait_for, wait_for_scheduler_passes

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def submit(user, *, epochs: int, name: str = "sweep", **sweep) -> Job:
    spec = parse_spec({"task_name": name, "team": "vision", "resources": {"gpu": 1}, "timeout": 3600,
                       "command": f"yolo train data=demo model=yolov8n.yaml epochs={epochs} imgsz=64 optimizer=SGD",
                       "sweep": sweep})
    job, _ = job_submit(user=user, spec=spec)
    return job


def state(job: Job) -> str:
    return Job.objects.filter(pk=job.pk).values_list("state", flat=True).get()


def at_most_parallel(parent: Job, parallel: int) -> None:
    """From the rows: at no moment were more than ``parallel`` trials submitted and not yet ended."""
    spans = [(j.created_at, j.finished_at) for j in Job.objects.filter(parent=parent)]
    for moment, _ in spans:
        alive = sum(1 for created, finished in spans if created <= moment and (finished is None or moment < finished))
        assert alive <= parallel, f"{alive} trials active at {moment}"


@pytest.mark.faults
def test_the_scheduler_dies_mid_sweep_and_no_trial_is_lost_or_made_twice(live, alice):
    """Killed right after its sweep step committed the first trials (before planning them), then
    SIGKILLed again while trials train: every trial exists once, all run, the sweep ends."""
    live.start_worker(gpus=2, **fast_trainer(1.0))
    parent = submit(alice, epochs=3, method="grid", parallel=2, parameters={"lr0": [0.01, 0.001, 0.1, 0.02, 0.005]})
    with InvariantWatch() as watch:
        crashing = live.start_scheduler("crashing", YOLOPORTAL_FAULT="after_sweep_step")
        assert crashing.wait(120) == 17  # os._exit(17) at the fault point
        assert Trial.objects.filter(sweep=parent).count() == 2
        assert set(Job.objects.filter(parent=parent).values_list("state", flat=True)) == {JobState.QUEUED}
        live.start_scheduler()
        wait_for(lambda: Job.objects.filter(parent=parent, state=JobState.SUCCEEDED).count() >= 2
                 and Job.objects.filter(parent=parent, state=JobState.RUNNING).exists(), 180,
                 what="two trials done and a third training")
        live.kill("scheduler")  # SIGKILL, mid-sweep
        time.sleep(2)
        live.start_scheduler()
        wait_for(lambda: state(parent) in TERMINAL_STATES, 300, what="the sweep to end")
    assert watch.violations == []
    assert state(parent) == JobState.SUCCEEDED
    trials = list(Trial.objects.filter(sweep=parent).order_by("number"))
    assert [t.number for t in trials] == [0, 1, 2, 3, 4]
    assert [t.params["lr0"] for t in trials] == [0.01, 0.001, 0.1, 0.02, 0.005]
    jobs = list(Job.objects.filter(parent=parent))
    assert len(jobs) == 5 and {j.pk for j in jobs} == {t.job_id for t in trials}
    assert all(j.state == JobState.SUCCEEDED for j in jobs)
    at_most_parallel(parent, 2)
    version = ModelVersion.objects.get(name="sweep")
    assert version.lineage["sweep"]["trial"] == 0 and version.lineage["sweep"]["params"] == {"lr0": 0.01}


def test_a_lagging_trial_is_stopped_at_the_epoch_the_pruner_names(live, alice):
    """Median pruner, two startup trials, no warmup; one trial at a time. The fast trainer's metric
    at epoch e is quality(lr0) × e / 4: trial 2 (lr0 1e-4, quality 1/3) reports 0.083 at epoch 1,
    below the median of trials 0 and 1 there (0.25 and 0.125 → 0.1875), so it is pruned at epoch 1;
    trial 3 (lr0 0.02, quality 0.77) stays above the median at every epoch and completes."""
    live.start_worker(gpus=1, **fast_trainer(2.5))
    live.start_scheduler()
    parent = submit(alice, epochs=4, method="grid", parallel=1, parameters={"lr0": [0.01, 0.001, 0.0001, 0.02]},
                    prune={"method": "median", "startup_trials": 2, "warmup_epochs": 0})
    wait_for(lambda: state(parent) in TERMINAL_STATES, 300, what="the sweep to end")
    assert state(parent) == JobState.SUCCEEDED
    trials = {t.number: t for t in Trial.objects.filter(sweep=parent).select_related("job")}
    lagging = trials[2]
    assert lagging.pruned_epoch == 1
    assert lagging.note.startswith("pruned at epoch 1 (metrics/mAP50-95(B) 0.08333 below the median of trials at "
                                   "that epoch, 0.1875 over 2 completed trial(s))"), lagging.note
    assert lagging.job.state == JobState.CANCELLED and lagging.job.epochs_done < 4  # stopped, not finished
    assert JobEvent.objects.filter(job=lagging.job, kind="cancel_requested", message__contains="pruned at epoch 1")
    assert [trials[n].pruned for n in (0, 1, 3)] == [False, False, False]
    assert all(trials[n].job.state == JobState.SUCCEEDED for n in (0, 1, 3))
    done = JobEvent.objects.get(job=parent, kind="succeeded")
    assert (done.data["completed"], done.data["pruned"], done.data["failed"]) == (3, 1, 0)
    assert done.data["best"]["trial"] == 0


def test_cancelling_the_sweep_stops_its_running_trials_and_submits_no_more(live, alice):
    live.start_worker(gpus=2, **fast_trainer(1.0))
    live.start_scheduler()
    parent = submit(alice, epochs=60, method="random", trials=6, parallel=2,
                    parameters={"lr0": {"low": 1e-4, "high": 0.1, "log": True}})
    wait_for(lambda: Job.objects.filter(parent=parent, state=JobState.RUNNING, epochs_done__gte=1).count() == 2,
             180, what="two trials training")
    response = api_client(alice).post(f"/api/v1/jobs/{parent.pk}/cancel/")
    assert response.status_code == 202 and response.json()["state"] == "cancelled"
    wait_for(lambda: not Job.objects.filter(parent=parent, state__in=ACTIVE_STATES).exists(), 120,
             what="the trials to stop")
    trials = list(Job.objects.filter(parent=parent))
    assert len(trials) == 2 and {j.state for j in trials} == {JobState.CANCELLED}
    assert all(j.epochs_done < 60 for j in trials)
    # Two whole scheduler passes (each runs the sweep step) with both trials ended: still no new trial.
    wait_for_scheduler_passes(after=time.time(), passes=2)
    assert Job.objects.filter(parent=parent).count() == 2


def test_a_sweep_with_ultralytics_registers_its_best_trial(live, alice):
    """Two real trainings (yolov8n from YAML, demo data, imgsz 64, one epoch each)."""
    live.start_worker(gpus=1)
    live.start_scheduler()
    parent = submit(alice, epochs=1, name="real-sweep", method="grid", parallel=1,
                    parameters={"lr0": [0.01, 0.02]})
    wait_for(lambda: state(parent) in TERMINAL_STATES, 600, what="the sweep to end")
    assert state(parent) == JobState.SUCCEEDED, Job.objects.get(pk=parent.pk).error
    trials = list(Trial.objects.filter(sweep=parent).select_related("job").order_by("number"))
    assert [t.job.state for t in trials] == [JobState.SUCCEEDED, JobState.SUCCEEDED]
    assert all(t.value is not None and 0 <= t.value <= 1 for t in trials)
    points = MetricPoint.objects.filter(job=trials[0].job).get()
    assert "metrics/mAP50-95(B)" in points.values
    best = max(trials, key=lambda t: (t.value, -t.number))
    version = ModelVersion.objects.get(name="real-sweep")
    assert version.job_id == best.job_id and version.lineage["sweep"]["id"] == str(parent.pk)
    assert version.sha256 and version.metrics

