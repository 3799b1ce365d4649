"""yoloq and what an ended job left: its weights (pulled, named by epoch) and its results in status."""

from __future__ import annotations

import hashlib

import pytest
from django.conf import settings
from django.test import Client

from apps.jobs.models import Job, JobState
from apps.jobs.services import checkpoint_record
from tests.cli.test_yoloq import logged_in, run  # noqa: F401 - fixtures
from tests.jobs.factories import make_job
from tests.portal.test_job_modes import pcb, submit, succeed  # noqa: F401 - fixture

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.mark.usefixtures("logged_in")
def test_weights_pull_fetches_a_cancelled_jobs_checkpoint_and_status_says_which(alice, teams, tmp_path, capsys):
    job = make_job(team=teams["vision"], user=alice, state=JobState.CANCELLED, task_name="widgets", epochs_done=11)
    data = b"best.pt bytes of epoch 11"
    path = settings.JOBS_DIR / str(job.pk) / "checkpoints" / "epoch-0011.pt"
    path.parent.mkdir(parents=True)
    path.write_bytes(data)
    checkpoint_record(job, epoch=11, path=str(path), sha256=hashlib.sha256(data).hexdigest(), size=len(data), best=True)

    code, out, _ = run(capsys, "status", str(job.pk)[:8])
    assert code == 0
    assert f"weights: the job was cancelled after 11 epochs: its best.pt as of epoch 11 (a training checkpoint) " \
           f"(yoloq weights pull {str(job.pk)[:8]})" in out

    target = tmp_path / "got.pt"
    code, out, err = run(capsys, "weights", "pull", str(job.pk)[:8], "-o", str(target))
    assert code == 0, err
    assert target.read_bytes() == data and out.startswith(f"Saved {target}: the job was cancelled after 11 epochs")
    assert f"sha256 {hashlib.sha256(data).hexdigest()} (verified)" in out  # CI trial 17, H4


@pytest.mark.usefixtures("logged_in")
def test_weights_pull_of_a_job_cancelled_before_any_epoch_says_why(alice, teams, capsys):
    job = make_job(team=teams["vision"], user=alice, state=JobState.CANCELLED)

    code, out, _ = run(capsys, "status", str(job.pk)[:8])
    assert "weights: The job was cancelled before it started, so it has no weights." in out  # never started
    code, _, err = run(capsys, "weights", "pull", str(job.pk)[:8])
    assert code == 1 and "cancelled before it started" in err
    assert Job.objects.count() == 1


@pytest.mark.usefixtures("logged_in")
def test_status_of_a_val_job_prints_its_evaluation_and_no_epochs(bob, pcb, capsys):  # noqa: F811
    from tests.jobs.test_job_outcome import val_job

    job = val_job(bob, pcb)

    code, out, _ = run(capsys, "status", str(job.pk)[:8])

    assert code == 0 and "epochs done" not in out
    # The job's page with its per-class table, not the model's API JSON (chaos22).
    assert ("evaluation: mAP50-95 0.412, mAP50 0.634, P 0.71, R 0.52 on demo:v1 val split, 1 classes "
            "(per class: http") in out and f"/jobs/{job.pk}/#per-class)" in out and "/api/v1/" not in out
    page = Client()
    page.force_login(bob)
    assert 'id="per-class"' in page.get(f"/jobs/{job.pk}/").content.decode()


@pytest.mark.usefixtures("logged_in")
def test_status_of_a_classifiers_predict_job_says_its_images_were_classified_not_0_boxes(bob, pcb, capsys):  # noqa: F811
    """A classify model's predictions are each image's top-5 classes: "6 images, 0 boxes" read as nothing found."""
    pcb.task = "classify"  # before the submit, which records the task the job runs as
    pcb.save(update_fields=["task"])
    job = submit(bob, f"yolo predict model={pcb.reference} source=demo split=val", "predict")
    folder = job.run_dir / "predict"
    folder.mkdir(parents=True)
    (folder / "predictions.json").write_text("[]")
    job = succeed(job, {"mode": "predict", "folder": str(folder), "images": 6, "boxes": 0, "exports": []})

    code, out, _ = run(capsys, "status", str(job.pk)[:8])

    assert code == 0
    assert "predictions: 6 images classified (top-5 classes each) (gallery: http" in out and "boxes" not in out


@pytest.mark.usefixtures("logged_in")
def test_status_of_a_detect_predict_job_counts_its_boxes(bob, pcb, capsys):  # noqa: F811
    job = submit(bob, f"yolo predict model={pcb.reference} source=demo split=val", "predict")
    folder = job.run_dir / "predict"
    folder.mkdir(parents=True)
    (folder / "predictions.json").write_text("[]")
    job = succeed(job, {"mode": "predict", "folder": str(folder), "images": 6, "boxes": 9, "exports": []})

    code, out, _ = run(capsys, "status", str(job.pk)[:8])

    assert code == 0 and "predictions: 6 images, 9 boxes (gallery: http" in out and "classified" not in out
    assert f"/jobs/{job.pk}/predictions/; JSON: http" in out and f"/api/v1/jobs/{job.pk}/predictions/)" in out


@pytest.mark.usefixtures("logged_in")
def test_status_of_a_trained_job_names_its_model_as_specs_take_it(bob, pcb, capsys):  # noqa: F811
    """Trial 20: it printed "model: models/8 (download: …)", an API path, not the pcb:v1 a spec takes."""
    code, out, _ = run(capsys, "status", str(pcb.job_id)[:8])

    assert code == 0
    assert f"model: pcb:v1 (id {pcb.pk}; train from it: model=pcb:v1; yoloq model pull {pcb.pk})" in out
