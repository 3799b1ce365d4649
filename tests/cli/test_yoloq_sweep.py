"""yoloq with a sweep: submit prints a sweep, status prints the same trials table as the API."""

from __future__ import annotations

import pytest

from apps.jobs.models import Job
from apps.sweeps.services import sweeps_advance
from tests.cli.test_yoloq import logged_in, run  # noqa: F401 - fixtures
from tests.conftest import api_client
from tests.sweeps.conftest import train, trial_jobs
from tests.sweeps.test_sweep_step import SWEEP_YAML

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.mark.usefixtures("logged_in")
def test_status_of_a_sweep_prints_its_trials_table_and_best(alice, node, tmp_path, capsys):
    spec = tmp_path / "sweep.yaml"
    spec.write_text(SWEEP_YAML.replace("prune: median", "prune: median\n  seed: 5"))
    code, out, _ = run(capsys, "submit", str(spec))
    assert code == 0 and "Submitted sweep" in out
    parent = Job.objects.get(is_sweep=True)
    sweeps_advance()
    first, second = trial_jobs(parent)
    train(first, node, [0.2, 0.4, 0.5])
    train(second, node, [0.1, 0.2, 0.3])
    sweeps_advance()

    code, out, _ = run(capsys, "status", str(parent.pk)[:8])
    assert code == 0, out
    table = api_client(alice).get(f"/api/v1/jobs/{parent.pk}/sweep/").json()
    assert "sweep: tpe, 4 of 4 trials submitted, at most 2 at once; pruning median" in out
    header = next(line for line in out.splitlines() if line.startswith("TRIAL"))
    assert header.split() == ["TRIAL", "LR0", "BATCH", "STATE", "METRIC", "EPOCHS", "PRUNED", "JOB"]
    rows = [line.split() for line in out.splitlines() if line[:1].isdigit()]
    assert [r[0] for r in rows] == ["0", "1", "2", "3"]
    assert rows[0][3:6] == ["succeeded", "0.5", "3/3"] and rows[1][3:6] == ["succeeded", "0.3", "3/3"]
    assert rows[2][3] == rows[3][3] == "queued"
    lr0 = first.spec["train_args"]["lr0"]
    assert rows[0][1] == f"{lr0:.4g}"
    assert f"best: trial 0, metrics/mAP50-95(B) 0.5: lr0={lr0:.4g}" in out
    assert [(r["number"], r["state"], r["value"]) for r in table["rows"]] == [
        (int(r[0]), r[3], float(r[4]) if r[4] != "-" else None) for r in rows]


@pytest.mark.usefixtures("logged_in")
def test_status_of_a_sweep_says_why_a_trial_was_not_submitted(alice, tmp_path, capsys):
    from apps.sweeps.models import Trial

    spec = tmp_path / "sweep.yaml"
    spec.write_text(SWEEP_YAML)
    assert run(capsys, "submit", str(spec))[0] == 0
    parent = Job.objects.get(is_sweep=True)
    # What sweep_trial_submit records when the trial's own submit is refused.
    Trial.objects.create(sweep=parent, number=0, params={"lr0": 0.01, "batch": 8}, recorded=True,
                         note="could not be submitted: train.data: dataset demo:v1 was deleted")

    code, out, _ = run(capsys, "status", str(parent.pk)[:8])

    assert code == 0
    assert "not submitted" in out
    assert "trial 0: could not be submitted: train.data: dataset demo:v1 was deleted" in out


@pytest.mark.usefixtures("logged_in")
def test_status_of_a_sweep_gives_its_trials_resources_and_no_epochs_of_its_own(tmp_path, capsys):
    """Trial 23: "resources: 0 GPU(s)" and "epochs done: 0/3" for a sweep whose trials had trained."""
    spec = tmp_path / "sweep.yaml"
    spec.write_text(SWEEP_YAML)
    assert run(capsys, "submit", str(spec))[0] == 0
    parent = Job.objects.get(is_sweep=True)

    code, out, _ = run(capsys, "status", str(parent.pk)[:8])

    assert code == 0
    assert f"resources: 1 GPU(s) and a timeout of {parent.timeout_s} s per trial" in out
    assert "epochs done" not in out
