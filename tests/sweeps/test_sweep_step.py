"""The sweep step (apps.sweeps.services) against the database: trials submitted a few at a time,
judged each epoch, the sweep ended with its best version; cancels, failures, restarts."""

from __future__ import annotations

import pytest

from apps.jobs.models import ACTIVE_STATES, Job, JobEvent, JobState
from apps.jobs.services import job_cancel
from apps.registry.models import ModelVersion
from apps.scheduling.loop import plan_and_start
from apps.sweeps.models import Trial
from apps.sweeps.selectors import sweep_view
from apps.sweeps.services import sweeps_advance, trial_submit

from .conftest import METRIC, finish, report, start, submit_sweep, train, trial_jobs

pytestmark = pytest.mark.django_db


def test_the_parent_runs_at_once_on_no_node_with_no_gpu_and_the_scheduler_never_places_it(sweeper, node):
    parent = submit_sweep(sweeper, parameters={"lr0": [0.01, 0.001]}, method="grid", parallel=2)
    assert (parent.state, parent.node, parent.gpus, parent.is_sweep) == (JobState.RUNNING, None, 0.0, True)
    assert parent.spec["sweep"]["seed"] is not None
    sweeps_advance()
    plan_and_start()
    parent.refresh_from_db()
    assert parent.node is None and parent.gpu_indices == [] and not parent.gpu_slots.exists()
    placed = trial_jobs(parent, JobState.STARTING)
    assert len(placed) == 2 and {j.gpus for j in placed} == {1.0}


def test_trials_are_ordinary_train_jobs_of_the_owner_on_the_sweeps_pinned_dataset(sweeper):
    parent = submit_sweep(sweeper, parameters={"lr0": [0.01, 0.001]}, method="grid")
    sweeps_advance()
    first, second = trial_jobs(parent)
    assert (first.user, first.team, first.parent, first.is_sweep) == (sweeper, parent.team, parent, False)
    assert first.task_name == "lr-sweep-t0" and first.spec["train_args"]["lr0"] == 0.01
    assert second.spec["train_args"]["lr0"] == 0.001
    version = parent.spec["inputs"]["data"]["version"]
    assert first.spec["train_args"]["data"] == f"demo:v{version}"
    assert first.spec["train_args"]["epochs"] == 3 and first.spec["train_args"]["imgsz"] == 64


def test_parallel_is_respected_through_the_whole_sweep(sweeper, node):
    parent = submit_sweep(sweeper, parameters={"lr0": {"low": 1e-4, "high": 0.1, "log": True}}, trials=5,
                          parallel=2, method="random")
    most = 0
    for _ in range(20):
        sweeps_advance()
        active = trial_jobs(parent, *ACTIVE_STATES)
        most = max(most, len(active))
        assert len(active) <= 2
        if not active:
            break
        train(active[0], node, [0.1, 0.2, 0.3])
    assert most == 2
    parent.refresh_from_db()
    assert parent.state == JobState.SUCCEEDED
    assert Trial.objects.filter(sweep=parent).count() == len(trial_jobs(parent)) == 5


def test_the_best_trials_weights_are_registered_with_the_sweep_as_lineage(sweeper, node):
    parent = submit_sweep(sweeper, parameters={"lr0": [0.01, 0.001, 0.1]}, method="grid", parallel=3)
    sweeps_advance()
    for job, final in zip(trial_jobs(parent), (0.30, 0.55, 0.20), strict=True):
        train(job, node, [final / 2, final], gpu=0)
    assert not ModelVersion.objects.exists()  # trials register nothing themselves
    sweeps_advance()
    parent.refresh_from_db()
    best = Trial.objects.get(sweep=parent, number=1)
    assert parent.state == JobState.SUCCEEDED and best.value == 0.55
    version = ModelVersion.objects.get()
    assert (version.name, version.job_id, version.team) == ("lr-sweep", best.job_id, parent.team)
    assert version.lineage["sweep"] == {"id": str(parent.pk), "task_name": "lr-sweep", "method": "grid",
                                        "metric": METRIC, "trials": 3, "trial": 1, "value": 0.55,
                                        "params": {"lr0": 0.001}}
    assert version.lineage["dataset"]["name"] == "demo"
    assert parent.weights_path == best.job.weights_path
    done = JobEvent.objects.filter(job=parent, kind="succeeded").get()
    assert "best: trial 1" in done.message and "registered as vision/lr-sweep:v1" in done.message


def test_a_sweep_whose_trials_all_tie_says_so_and_which_it_kept(sweeper, node):
    """Every trial scored 0: "best: trial 0" alone read as if trial 0 had won (trial25 F12). The final
    event, the API and the page say that all tied, at what, and which was kept."""
    from django.test import Client

    from cli.yoloq import sweep_text
    from tests.conftest import api_client

    parent = submit_sweep(sweeper, parameters={"lr0": [0.01, 0.001, 0.1]}, method="grid", parallel=3)
    sweeps_advance()
    for job in trial_jobs(parent):
        train(job, node, [0.0, 0.0], gpu=0)
    sweeps_advance()
    parent.refresh_from_db()
    assert parent.state == JobState.SUCCEEDED
    note = "all 3 completed trials tied at 0: kept trial 0, the first by trial number"
    done = JobEvent.objects.filter(job=parent, kind="succeeded").get()
    assert f"best: trial 0, {METRIC} 0 ({note})" in done.message
    assert done.data["best"]["tied"] == [0, 1, 2]
    table = api_client(sweeper).get(f"/api/v1/jobs/{parent.pk}/sweep/").json()
    assert (table["best"]["number"], table["best"]["tied"], table["best"]["tie_note"]) == (0, [0, 1, 2], note)
    assert note in sweep_text(table).splitlines()  # yoloq status
    browser = Client()
    browser.force_login(sweeper)
    assert "All 3 completed trials tied at 0: kept trial 0, the first by trial number." in \
        browser.get(f"/jobs/{parent.pk}/").content.decode()


def test_a_tie_of_some_trials_names_them_and_no_tie_says_nothing(sweeper, node):
    parent = submit_sweep(sweeper, parameters={"lr0": [0.01, 0.001, 0.1]}, method="grid", parallel=3)
    sweeps_advance()
    first, second, third = trial_jobs(parent)
    train(first, node, [0.2, 0.3], gpu=0)
    sweeps_advance()
    assert sweep_view(parent)["best"]["tie_note"] == ""
    train(second, node, [0.5, 0.6], gpu=0)
    train(third, node, [0.6, 0.6], gpu=0)
    sweeps_advance()
    best = sweep_view(parent)["best"]
    assert (best["number"], best["tie_note"]) == (1, "trials 1 and 2 tied at 0.6: kept trial 1, the first by trial number")


def test_a_sweep_whose_name_another_task_took_while_it_ran_registers_its_best_as_name_task(sweeper, node):
    """A name's versions are one task (apps.registry.services.version_number_claim): the sweep still
    succeeds with its best weights, under lr-sweep-detect, and its final event says why."""
    parent = submit_sweep(sweeper, parameters={"lr0": [0.01, 0.001]}, method="grid", parallel=2)
    sweeps_advance()
    ModelVersion.objects.create(team=parent.team, name="lr-sweep", version=1, task="classify",
                                weights_key="models/vision/lr-sweep/v1/x.pt")
    for job, final in zip(trial_jobs(parent), (0.30, 0.55), strict=True):
        train(job, node, [final / 2, final], gpu=0)
    sweeps_advance()
    parent.refresh_from_db()
    assert parent.state == JobState.SUCCEEDED
    version = ModelVersion.objects.get(job_id=Trial.objects.get(sweep=parent, number=1).job_id)
    assert (version.reference, version.task) == ("lr-sweep-detect:v1", "detect")
    done = JobEvent.objects.filter(job=parent, kind="succeeded").get()
    assert "registered as vision/lr-sweep-detect:v1 (not as lr-sweep: lr-sweep's versions are classify models" \
        in done.message


def test_a_succeeded_sweeps_weights_are_its_best_trials_registered_ones(sweeper, node):
    """jobs/{sweep}/weights/ said "The weights file is gone." while the job said they were there, and
    the sweep's model_version was null (CI trial 17, H5)."""
    from tests.conftest import api_client

    parent = submit_sweep(sweeper, parameters={"lr0": [0.01, 0.001]}, method="grid", parallel=2)
    sweeps_advance()
    for job, final in zip(trial_jobs(parent), (0.30, 0.55), strict=True):
        train(job, node, [final / 2, final], gpu=0)
    sweeps_advance()
    best, version = Trial.objects.get(sweep=parent, number=1).job, ModelVersion.objects.get()
    client = api_client(sweeper)

    download = client.get(f"/api/v1/jobs/{parent.pk}/weights/")
    assert download.status_code == 200 and b"".join(download.streaming_content) == f"weights of {best.pk}".encode()
    assert "trial 1" in download["X-Weights-Note"] and "lr-sweep:v1" in download["X-Weights-Note"]
    detail = client.get(f"/api/v1/jobs/{parent.pk}/").json()
    assert detail["weights"]["available"] and detail["model_version"] == version.pk


def test_a_lagging_trial_is_pruned_at_the_epoch_the_pruner_says_and_counts_as_finished(sweeper, node):
    """Median pruner, 2 startup trials, no warmup: the third trial's best falls below the median at epoch 2."""
    parent = submit_sweep(sweeper, epochs=4, parameters={"lr0": [0.01, 0.02, 0.03]}, method="grid", parallel=1,
                          prune={"method": "median", "startup_trials": 2, "warmup_epochs": 0})
    for curve in ([0.50, 0.60, 0.70, 0.80], [0.40, 0.50, 0.60, 0.70]):
        sweeps_advance()
        (job,) = trial_jobs(parent, *ACTIVE_STATES)
        train(job, node, curve)
    sweeps_advance()
    (lagging,) = trial_jobs(parent, *ACTIVE_STATES)
    lagging = start(lagging, node)
    report(lagging, 1, 0.45)  # median of 0.50 and 0.40 is 0.45: not below
    sweeps_advance()
    assert Job.objects.get(pk=lagging.pk).cancel_requested_at is None
    report(lagging, 2, 0.30)  # best so far 0.45 < median 0.55
    sweeps_advance()
    trial = Trial.objects.get(job=lagging)
    assert trial.pruned_epoch == 2
    reason = ("pruned at epoch 2 (metrics/mAP50-95(B) 0.45 below the median of trials at that epoch, 0.55 over 2 "
              "completed trial(s))")
    assert trial.note == reason
    lagging.refresh_from_db()
    assert lagging.cancel_requested_at is not None
    assert JobEvent.objects.filter(job=lagging, kind="cancel_requested").get().message == f"cancel requested: {reason}"
    report(lagging, 3, 0.31)  # the worker has not stopped it yet: no second decision
    sweeps_advance()
    assert finish(lagging, "cancelled") == "cancelled"
    sweeps_advance()
    parent.refresh_from_db()
    assert parent.state == JobState.SUCCEEDED
    assert JobEvent.objects.filter(job=parent, kind="succeeded").get().data == {
        "trials": 3, "completed": 2, "pruned": 1, "failed": 0, "model": "lr-sweep:v1",
        "best": {"trial": 0, "job": str(trial_jobs(parent)[0].pk), "value": 0.8, "params": {"lr0": 0.01},
                 "tied": [0]}}


def test_cancelling_the_parent_cancels_its_queued_and_running_trials(sweeper, node, bob):
    parent = submit_sweep(sweeper, parameters={"lr0": [0.01, 0.02, 0.03, 0.04]}, method="grid", parallel=2)
    sweeps_advance()
    running, queued = trial_jobs(parent)
    running = start(running, node)
    assert job_cancel(job=parent, by=sweeper)
    parent.refresh_from_db()
    assert parent.state == JobState.CANCELLED
    assert Job.objects.get(pk=queued.pk).state == JobState.CANCELLED
    running.refresh_from_db()
    assert running.state == JobState.RUNNING and running.cancel_requested_at is not None  # its worker stops it
    sweeps_advance()
    assert len(trial_jobs(parent)) == 2  # no trial after the cancel
    assert not job_cancel(job=parent, by=sweeper)


def test_a_trial_submitted_while_its_sweep_was_cancelled_is_cancelled_by_the_next_pass(sweeper):
    parent = submit_sweep(sweeper, parameters={"lr0": [0.01, 0.02]}, method="grid", parallel=2)
    stale = Job.objects.get(pk=parent.pk)
    job_cancel(job=parent, by=sweeper)
    trial = trial_submit(stale, 0, {"lr0": 0.01})  # a step that read the sweep running a moment ago
    assert trial.job.state == JobState.QUEUED
    assert sweeps_advance()
    assert Job.objects.get(pk=trial.job_id).state == JobState.CANCELLED


def test_a_failed_trial_does_not_fail_the_sweep_unless_all_do(sweeper, node):
    parent = submit_sweep(sweeper, parameters={"lr0": [0.01, 0.02]}, method="grid", parallel=2)
    sweeps_advance()
    first, second = trial_jobs(parent)
    train(first, node, [0.1], outcome="failed")
    train(second, node, [0.2, 0.3])
    sweeps_advance()
    parent.refresh_from_db()
    assert parent.state == JobState.SUCCEEDED

    doomed = submit_sweep(sweeper, name="doomed", parameters={"lr0": [0.01, 0.02]}, method="grid", parallel=2)
    sweeps_advance()
    for job in trial_jobs(doomed):
        train(job, node, [0.1], outcome="failed")
    sweeps_advance()
    doomed.refresh_from_db()
    assert doomed.state == JobState.FAILED
    assert doomed.error.startswith("every trial failed; trial 0: boom")


def test_trial_creation_is_idempotent_by_sweep_and_number(sweeper):
    parent = submit_sweep(sweeper, parameters={"lr0": [0.01, 0.02]}, method="grid", parallel=1)
    once = trial_submit(parent, 0, {"lr0": 0.01})
    again = trial_submit(parent, 0, {"lr0": 0.01})
    assert once.pk == again.pk and once.job_id == again.job_id
    assert Job.objects.filter(parent=parent).count() == 1
    sweeps_advance()  # parallel 1 is full: the step submits nothing
    assert Job.objects.filter(parent=parent).count() == 1


def test_a_trial_that_cannot_be_submitted_is_a_failed_trial_with_the_reason(sweeper, node):
    from apps.datasets.models import Dataset

    parent = submit_sweep(sweeper, parameters={"lr0": [0.01, 0.02]}, method="grid", parallel=1)
    Dataset.objects.filter(team=parent.team, name="demo").delete()
    sweeps_advance()
    trials = list(Trial.objects.filter(sweep=parent))
    assert [t.job for t in trials] == [None, None]
    assert "could not be submitted" in trials[0].note and "train.data" in trials[0].note
    parent.refresh_from_db()
    assert parent.state == JobState.FAILED


def test_the_owners_active_job_limit_makes_trials_wait_not_fail(sweeper, settings):
    settings.MAX_ACTIVE_JOBS_PER_USER = 3
    parent = submit_sweep(sweeper, parameters={"lr0": [0.01, 0.02, 0.03]}, method="grid", parallel=2)
    from tests.jobs.factories import make_job

    make_job(team=parent.team, user=sweeper)  # parent + this + one trial = 3
    sweeps_advance()
    assert Trial.objects.filter(sweep=parent).count() == 1
    assert Job.objects.filter(parent=parent).count() == 1


# --- the API ---------------------------------------------------------------------------------------

SWEEP_YAML = """\
task_name: lr-sweep
command: "yolo train data=demo model=yolov8n.yaml epochs=3 imgsz=64 optimizer=SGD"
resources: {gpu: 1}
sweep:
  method: tpe
  parameters:
    lr0: {low: 1e-4, high: 1e-1, log: true}
    batch: [8, 16]
  trials: 4
  parallel: 2
  prune: median
"""


def test_the_api_takes_a_sweep_as_yaml_and_shows_its_table(sweeper, node, carol):
    from tests.conftest import api_client

    client = api_client(sweeper)
    response = client.post("/api/v1/jobs/", SWEEP_YAML, content_type="application/yaml")
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["state"], body["is_sweep"], body["resources"]["gpu"], body["node"]) == ("running", True, 0.0, None)
    sweeps_advance()
    first, _ = trial_jobs(Job.objects.get(pk=body["id"]))
    train(first, node, [0.2, 0.4, 0.5])
    sweeps_advance()  # the worker kicks the scheduler when a trial ends
    table = client.get(f"/api/v1/jobs/{body['id']}/sweep/").json()
    assert (table["method"], table["trials"], table["parallel"], table["metric"]) == ("tpe", 4, 2, METRIC)
    assert [r["state"] for r in table["rows"]] == ["succeeded", "queued", "queued"]
    row = table["rows"][0]
    assert 1e-4 <= row["params"]["lr0"] <= 0.1 and row["params"]["batch"] in (8, 16)
    assert (row["value"], row["epochs_done"], row["epochs"], row["pruned"]) == (0.5, 3, 3, False)
    assert table["best"]["number"] == 0 and table["best_so_far"] == [{"number": 0, "value": 0.5, "best": 0.5}]
    assert client.get(f"/api/v1/jobs/{row['job']}/").json()["parent"] == body["id"]
    assert client.get(f"/api/v1/jobs/{row['job']}/sweep/").status_code == 404  # a trial is not a sweep
    assert api_client(carol).get(f"/api/v1/jobs/{body['id']}/sweep/").status_code == 404  # another team's


def test_every_400_names_the_sweep_field(sweeper, settings):
    from tests.conftest import api_client

    client = api_client(sweeper)
    bad = SWEEP_YAML.replace("low: 1e-4", "low: -1").replace("[8, 16]", "[8, 0.5, lots]")
    errors = client.post("/api/v1/jobs/", bad, content_type="application/yaml").json()
    assert set(errors) == {"sweep.parameters.lr0.low", "sweep.parameters.batch[2]"}, errors
    settings.MAX_ACTIVE_JOBS_PER_USER = 2
    errors = client.post("/api/v1/jobs/", SWEEP_YAML, content_type="application/yaml").json()
    assert list(errors) == ["sweep.parallel"] and "MAX_ACTIVE_JOBS_PER_USER" in errors["sweep.parallel"][0]
    settings.MAX_ACTIVE_JOBS_PER_USER = 100
    # A per-job limit names the sweep field: here dataloader workers beyond the CPUs asked for.
    # (batch=-1 on a share of a GPU is allowed since issue 12: the child caps itself to its share.)
    cpus = SWEEP_YAML.replace("{gpu: 1}", "{gpu: 1, cpu: 2}").replace("batch: [8, 16]", "workers: [0, 4]")
    errors = client.post("/api/v1/jobs/", cpus, content_type="application/yaml").json()
    assert list(errors) == ["sweep.parameters.workers[1]"], errors
    assert "resources.cpu" in errors["sweep.parameters.workers[1]"][0]
    models = SWEEP_YAML.replace("batch: [8, 16]", "model: [yolov8n.yaml, nosuch.pt]")
    errors = client.post("/api/v1/jobs/", models, content_type="application/yaml").json()
    assert list(errors) == ["sweep.parameters.model[1]"], errors


def test_a_model_choice_is_checked_against_the_dataset_as_a_plain_submit_is(sweeper):
    """A segment model on a dataset of boxes: refused at submit, not a trial "not submitted" later."""
    from tests.conftest import api_client

    models = SWEEP_YAML.replace("batch: [8, 16]", "model: [yolov8n.yaml, yolov8n-seg.yaml]")
    response = api_client(sweeper).post("/api/v1/jobs/", models, content_type="application/yaml")

    assert response.status_code == 400
    errors = response.json()
    assert list(errors) == ["sweep.parameters.model[1]"], errors
    assert errors["sweep.parameters.model[1]"][0].startswith("command.data: dataset demo:v1 holds boxes")
    assert not Job.objects.exists()


def test_a_sweep_cannot_be_requeued_it_runs_no_attempt(sweeper):
    from tests.conftest import api_client

    parent = submit_sweep(sweeper, parameters={"lr0": [0.01, 0.02]}, method="grid")
    response = api_client(sweeper).post(f"/api/v1/jobs/{parent.pk}/requeue/")
    assert response.status_code == 409 and "runs no attempt" in response.json()["state"][0]
    assert Job.objects.get(pk=parent.pk).state == JobState.RUNNING


@pytest.mark.parametrize("metric, task_in_message", [
    ("metrics/mAP50-95", "a detect training"),        # no (B): a typo Ultralytics never reports
    ("metrics/mAP50-95(M)", "a detect training"),     # a mask metric, but yolov8n.yaml trains detect
    ("metrics/accuracy_top1", "a detect training"),   # classify's
])
def test_a_metric_the_trials_never_report_is_refused_at_submit(sweeper, metric, task_in_message):
    """Such a sweep ran every trial to the end, ranked none and registered nothing (trial21)."""
    from tests.conftest import api_client

    response = api_client(sweeper).post("/api/v1/jobs/", SWEEP_YAML + f"  metric: {metric}\n",
                                        content_type="application/yaml")

    assert response.status_code == 400
    errors = response.json()
    assert list(errors) == ["sweep.metric"], errors
    assert f"{metric} is not a metric {task_in_message} reports" in errors["sweep.metric"][0]
    assert "metrics/mAP50-95(B)" in errors["sweep.metric"][0]
    assert not Job.objects.exists()


@pytest.mark.parametrize("metric", ["metrics/mAP50(B)", "metrics/recall(B)", "fitness"])
def test_a_metric_a_detect_training_reports_is_taken(sweeper, metric):
    parent = submit_sweep(sweeper, parameters={"lr0": [0.01, 0.02]}, method="grid", metric=metric)

    assert parent.spec["sweep"]["metric"] == metric
