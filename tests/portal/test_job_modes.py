"""The job page fits the job's mode: a training has its curves and epoch progress; a val, predict
or export job has none and shows what it stored instead (an evaluation, annotated images, exported
files). Outcomes are recorded the way the worker records them: ``attempt_finish`` with the child's
``finished`` event."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from apps.jobs.models import Job, JobState, MetricPoint
from apps.jobs.services import attempt_finish, job_submit, job_transition
from apps.jobs.spec import parse_spec
from apps.registry.models import Export, ModelVersion

pytestmark = pytest.mark.django_db

CURVES = ('id="loss-chart"', 'id="epochs-done"', "chart.umd.min.js", "curves appear after the first epoch")


@pytest.fixture(autouse=True)
def stores(settings, tmp_path):
    settings.JOBS_DIR = tmp_path / "jobs"
    settings.MODELS_DIR = tmp_path / "models"
    settings.WEIGHTS_DIR = tmp_path / "weights"
    return settings


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def submit(user, command: str, task_name: str = "pcb") -> Job:
    document = {"task_name": task_name, "command": command, "user": "vision", "allow_duplicate": True,
                "resources": {"gpu": 1}}
    job, _ = job_submit(user=user, spec=parse_spec(document))
    return job


def succeed(job: Job, finished: dict) -> Job:
    """The worker's report of a successful attempt (the real service path)."""
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING)
    job.refresh_from_db()
    assert attempt_finish(job, outcome="succeeded", exit_code=0, finished=finished) == "succeeded"
    return Job.objects.get(pk=job.pk)


@pytest.fixture
def pcb(bob, demo_registered) -> ModelVersion:
    """pcb:v1, trained for two epochs on the demo dataset."""
    job = submit(bob, "yolo train data=demo model=yolov8n.yaml epochs=2")
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING)
    weights = job.run_dir / "train" / "weights" / "best.pt"
    weights.parent.mkdir(parents=True)
    weights.write_bytes(b"weights")
    for epoch in (1, 2):
        MetricPoint.objects.create(job=job, epoch=epoch, attempt=1, seq=epoch,
                                   values={"metrics/mAP50-95(B)": 0.1 * epoch, "train/box_loss": 2.0 / epoch})
    succeed(job, {"mode": "train", "weights": str(weights), "metrics": {"metrics/mAP50-95(B)": 0.2}, "exports": []})
    return ModelVersion.objects.get(job=job)


def page(user, job: Job) -> str:
    response = signed_in(user).get(f"/jobs/{job.pk}/")
    assert response.status_code == 200
    return response.content.decode()


def assert_no_training_layout(html: str) -> None:
    for marker in CURVES:
        assert marker not in html, marker
    assert "of <b>?</b> done" not in html


def test_a_training_keeps_its_curves_and_epoch_progress(bob, pcb):
    html = page(bob, pcb.job)
    for marker in CURVES:
        assert marker in html, marker
    assert 'id="outcome"' not in html and "</b> of <b>2</b> done" in html


def test_a_val_job_shows_its_evaluation_instead_of_curves(bob, pcb):
    job = succeed(submit(bob, f"yolo val model={pcb.reference} data=demo split=val", "val"), {
        "mode": "val", "split": "val", "exports": [],
        "metrics": {"metrics/precision(B)": 0.71, "metrics/recall(B)": 0.52, "metrics/mAP50(B)": 0.634,
                    "metrics/mAP50-95(B)": 0.412, "fitness": 0.43},
        "per_class": [{"class": 0, "name": "rectangle", "images": 4, "instances": 5, "precision": 0.8,
                       "recall": 0.6, "map50": 0.7, "map50_95": 0.5},
                      {"class": 1, "name": "circle", "images": 3, "instances": 3, "precision": 0.62,
                       "recall": 0.44, "map50": 0.568, "map50_95": 0.324}],
        "speed": {"inference": 5.1}})
    html = page(bob, job)
    assert_no_training_layout(html)
    assert 'id="outcome" data-mode="val"' in html and "pcb:v1 on demo:v1 · val split" in html
    for label, value in (("mAP50", "0.634"), ("mAP50-95", "0.412"), ("precision", "0.710"), ("recall", "0.520")):
        assert f'data-metric="{label}">{label} <b>{value}</b>' in html
    assert "<td>circle</td><td>3</td><td>3</td><td>0.620</td><td>0.440</td><td>0.568</td><td>0.324</td>" in html
    assert 'id="log"' in html


def test_a_predict_job_shows_its_annotated_images_and_result_files(bob, pcb):
    job = submit(bob, f"yolo predict model={pcb.reference} source=demo split=val", "predict")
    folder = job.run_dir / "predict"
    folder.mkdir(parents=True)
    results = []
    for n in range(3):
        (folder / f"{n:05d}.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
        results.append({"image": f"{n:05d}.jpg", "source": f"images/val/val_{n}.jpg", "size": [64, 64],
                        "boxes": [{"class": 0, "name": "rectangle", "conf": 0.9, "xyxy": [1, 2, 30, 40]}] * n})
    (folder / "predictions.json").write_text(json.dumps(results))
    job = succeed(job, {"mode": "predict", "folder": str(folder), "images": 3, "boxes": 3, "exports": []})
    html = page(bob, job)
    assert_no_training_layout(html)
    assert 'id="outcome" data-mode="predict"' in html and "3 images annotated, 3 boxes by" in html
    for n in range(3):
        assert f'<img src="/api/v1/jobs/{job.pk}/predictions/{n}/image/" alt="images/val/val_{n}.jpg"' in html
    assert f'href="/jobs/{job.pk}/predictions/"' in html and f'href="/api/v1/jobs/{job.pk}/predictions/"' in html
    assert 'id="log"' in html


def test_an_export_job_shows_its_files_with_download_links(bob, pcb):
    job = submit(bob, f"yolo export model={pcb.reference} format=onnx half=true", "export")
    onnx = job.run_dir / "export" / "best.onnx"
    onnx.parent.mkdir(parents=True)
    onnx.write_bytes(b"onnx bytes")
    job = succeed(job, {"mode": "export", "exports": [{
        "format": "onnx", "path": str(onnx), "options": {"half": True},
        "verification": {"runtime": "onnxruntime 1.32.0", "images": 4, "max_abs": 6.1e-05, "max_rel": 1.3e-07,
                         "rtol": 0.01, "atol": 0.01, "passed": True}}]})
    export = Export.objects.get(job=job)
    html = page(bob, job)
    assert_no_training_layout(html)
    assert 'id="outcome" data-mode="export"' in html
    link = f'href="/api/v1/exports/{export.pk}/download/" download>best.onnx</a>'
    assert link in html and "<td>onnx</td><td>half=True </td>" in html
    assert "onnxruntime 1.32.0 on 4 images" in html and "6.10e-05" in html
    download = signed_in(bob).get(f"/api/v1/exports/{export.pk}/download/")
    assert download.status_code == 200 and b"".join(download.streaming_content) == b"onnx bytes"


def test_an_unfinished_or_failed_model_job_says_where_its_results_will_be(bob, carol, pcb):
    job = submit(bob, f"yolo val model={pcb.reference} data=demo split=val", "val")
    html = page(bob, job)
    assert_no_training_layout(html)
    assert "The evaluation's metrics will be here when the job has finished." in html
    assert f'"outcome": "/jobs/{job.pk}/outcome/"' in html  # the page refetches the section when the job ends
    job_transition(job.pk, expected=[JobState.QUEUED], to=JobState.FAILED)
    fragment = signed_in(bob).get(f"/jobs/{job.pk}/outcome/")
    assert fragment.status_code == 200 and "The job is failed: it stored no results" in fragment.content.decode()
    assert signed_in(carol).get(f"/jobs/{job.pk}/outcome/").status_code == 404


@pytest.fixture
def shared(stores, tmp_path):
    """yolov8s.pt as shared base weights (an admin's ``manage.py weights add --shared``): no version.
    Its model names the demo dataset's classes: a val on other classes is refused at submit."""
    import io

    from django.core.management import call_command

    from apps.datasets.demo import CLASS_NAMES
    from tests.registry.conftest import build_checkpoint

    weights = build_checkpoint("yolov8n.yaml", tmp_path, names=dict(CLASS_NAMES))
    call_command("weights", "add", str(weights), "--shared", "--name", "yolov8s.pt", stdout=io.StringIO())


def test_a_val_of_shared_weights_keeps_its_evaluation_for_the_team(bob, carol, shared, demo_registered):
    from apps.registry.models import Evaluation
    from apps.registry.selectors import evaluation_list

    job = succeed(submit(bob, "yolo val model=yolov8s.pt data=demo split=val", "baseline"), {
        "mode": "val", "split": "val", "exports": [], "speed": {},
        "metrics": {"metrics/mAP50(B)": 0.25, "metrics/mAP50-95(B)": 0.125},
        "per_class": [{"class": 0, "name": "rectangle", "images": 4, "instances": 5, "precision": 0.5,
                       "recall": 0.25, "map50": 0.25, "map50_95": 0.125}]})
    evaluation = Evaluation.objects.get(job=job)  # was: nothing stored, the metrics lost
    assert evaluation.version is None and evaluation.model_lineage["kind"] == "shared"
    assert "evaluation of yolov8s.pt (shared) on val stored" in job.events.get(kind="succeeded").message
    html = page(bob, job)
    assert "yolov8s.pt (shared weights) on demo:v1 · val split" in html
    assert 'data-metric="mAP50">mAP50 <b>0.250</b>' in html and "<td>rectangle</td>" in html
    assert list(evaluation_list(user=bob)) == [evaluation] and not evaluation_list(user=carol).exists()
    assert signed_in(carol).get(f"/jobs/{job.pk}/").status_code == 404


def test_an_export_of_shared_weights_is_kept_with_its_job_and_downloads(bob, carol, shared, demo_registered):
    job = submit(bob, "yolo export model=yolov8s.pt format=onnx data=demo", "export")
    onnx = job.run_dir / "export" / "yolov8s.onnx"
    onnx.parent.mkdir(parents=True)
    onnx.write_bytes(b"onnx of the shared weights")
    job = succeed(job, {"mode": "export", "exports": [{
        "format": "onnx", "path": str(onnx), "options": {},
        "verification": {"runtime": "onnxruntime", "images": 2, "max_abs": 1e-05, "max_rel": 1e-07,
                         "rtol": 0.001, "atol": 0.001, "passed": True}}]})
    export = Export.objects.get(job=job)  # was: no row, the file unreachable
    assert export.version is None and export.model_lineage["name"] == "yolov8s.pt"
    html = page(bob, job)
    assert f'href="/api/v1/exports/{export.pk}/download/" download>yolov8s.onnx</a>' in html
    assert "Of yolov8s.pt (shared weights): kept with this job." in html
    download = signed_in(bob).get(f"/api/v1/exports/{export.pk}/download/")
    assert download.status_code == 200 and b"".join(download.streaming_content) == b"onnx of the shared weights"
    assert 'filename="yolov8s-yolov8s.onnx"' in download["Content-Disposition"]
    assert signed_in(carol).get(f"/api/v1/exports/{export.pk}/download/").status_code == 404


def test_an_export_of_a_version_whose_dataset_was_deleted_names_that_dataset(bob, alice, pcb):
    """Trial 20: the refusal said the weights "do not say which dataset they were trained on"; they do,
    it had been deleted."""
    from apps.datasets.services import dataset_delete
    from tests.conftest import api_client

    dataset_delete(dataset=pcb.dataset, by=alice)
    response = api_client(bob).post("/api/v1/jobs/", {
        "task_name": "export", "command": f"yolo export model={pcb.reference} format=onnx"}, format="json")

    assert response.status_code == 400
    assert response.json()["command.data"] == [
        "is required here: the export is verified on validation images, and the dataset they were trained on, "
        "demo:v1, has been deleted; name one with data=<dataset>"]


SEGMENT_METRICS = {"metrics/precision(B)": 0.9, "metrics/recall(B)": 0.8, "metrics/mAP50(B)": 0.85,
                   "metrics/mAP50-95(B)": 0.61, "metrics/precision(M)": 0.7, "metrics/recall(M)": 0.6,
                   "metrics/mAP50(M)": 0.55, "metrics/mAP50-95(M)": 0.33, "fitness": 0.94}


def test_a_segment_models_headline_is_its_mask_figures_named_so(bob, pcb):
    """The box figures were shown as a segment model's mAP50-95 … and the compare page ran both
    mAP50-95 values together ("0.6100.330") (trial21)."""
    job = submit(bob, f"yolo val model={pcb.reference} data=demo split=val", "val")
    pcb.metrics, pcb.task = SEGMENT_METRICS, "segment"  # after the submit: demo's labels are boxes
    pcb.save(update_fields=["metrics", "task"])
    job = succeed(job, {
        "mode": "val", "split": "val", "exports": [], "metrics": SEGMENT_METRICS, "speed": {},
        "per_class": [{"class": 0, "name": "wire", "of": "mask", "images": 4, "instances": 5, "precision": 0.7,
                       "recall": 0.6, "map50": 0.55, "map50_95": 0.33}]})
    other = ModelVersion.objects.create(team=pcb.team, name="boxes", version=1, task="detect", source="upload",
                                        metrics={"metrics/mAP50-95(B)": 0.5})

    html = page(bob, job)
    for label, value in (("mAP50-95", "0.330"), ("mAP50", "0.550"), ("precision", "0.700"), ("recall", "0.600")):
        assert f'data-metric="{label}">{label} (mask) <b>{value}</b>' in html, label
    assert "<th>mAP50 (mask)</th><th>mAP50-95 (mask)</th>" in html  # the worker's per-class rows say whose
    models = signed_in(bob).get("/models/").content.decode()
    row = models[models.index(f'id="model-{pcb.pk}"'):]
    row = row[:row.index("</tr>")]
    assert '<td>0.330 <small class="muted">mask</small></td>' in row and "0.610" not in row
    other_row = models[models.index(f'id="model-{other.pk}"'):]
    assert "<td>0.500</td>" in other_row[:other_row.index("</tr>")]
    compare = signed_in(bob).get(f"/models/compare/?ids={pcb.pk},{other.pk}").content.decode()
    assert "val: mAP50-95 0.330 (mask)" in compare and "0.6100.330" not in compare


def test_a_classifiers_headline_is_its_top1_accuracy_named_so(bob, teams):
    """A classify model has no mAP: the models list and the compare page show its top-1 accuracy, named."""
    pets = ModelVersion.objects.create(team=teams["vision"], name="pets", version=1, task="classify", source="upload",
                                       metrics={"metrics/accuracy_top1": 0.75, "metrics/accuracy_top5": 1.0})
    models = signed_in(bob).get("/models/").content.decode()
    row = models[models.index(f'id="model-{pets.pk}"'):]
    assert '<td>0.750 <small class="muted">top-1 accuracy</small></td>' in row[:row.index("</tr>")]


def test_a_classifiers_per_class_table_is_each_classes_top1_accuracy(bob, pcb):
    """A classify val's rows (from Ultralytics' confusion matrix) have no precision or mAP: the job page and
    the model's page show each class's images, how many its top-1 got right and that accuracy, named."""
    job = submit(bob, f"yolo val model={pcb.reference} data=demo split=val", "val")
    pcb.metrics, pcb.task = {"metrics/accuracy_top1": 0.6, "metrics/accuracy_top5": 1.0}, "classify"
    pcb.save(update_fields=["metrics", "task"])
    job = succeed(job, {
        "mode": "val", "split": "val", "exports": [], "speed": {}, "metrics": pcb.metrics,
        "per_class": [{"class": 0, "name": "cat", "of": "top1", "images": 2, "instances": None, "correct": 2,
                       "accuracy": 1.0},
                      {"class": 1, "name": "dog", "of": "top1", "images": 3, "instances": None, "correct": 1,
                       "accuracy": 1 / 3}]})

    for html in (page(bob, job), signed_in(bob).get(f"/models/{pcb.pk}/").content.decode()):
        assert "<th>Class</th><th>Images</th><th>Top-1 correct</th><th>Top-1 accuracy</th>" in html
        assert "<td>dog</td><td>3</td><td>1</td><td>0.333</td>" in html
        assert "<th>mAP50</th>" not in html and "<th>Precision</th>" not in html


def test_a_classifiers_export_says_it_compared_class_probabilities_and_top1(bob, pcb):
    job = submit(bob, f"yolo export model={pcb.reference} format=onnx", "export")
    exported = job.run_dir / "export" / "pcb.onnx"
    exported.parent.mkdir(parents=True)
    exported.write_bytes(b"onnx bytes")
    verification = {"runtime": "onnxruntime 1.20", "images": 4, "outputs": [[1, 3]], "precision": "fp32",
                    "max_abs": 2e-7, "max_rel": 3e-7, "rtol": 0.001, "atol": 0.001, "passed": True,
                    "compared": "class probabilities", "top1_same": 4, "top1_ties": 0}
    job = succeed(job, {"mode": "export", "exports": [{"format": "onnx", "path": str(exported), "options": {},
                                                       "verification": verification, "seconds": 1.0}]})

    html = page(bob, job)
    assert "onnxruntime 1.20 on 4 images (class probabilities; top-1 the same on 4) <span" in html
    assert "a tie on" not in html


def test_a_classifiers_predictions_show_each_images_top1_and_filter_by_it(bob, pcb):
    """A classify model's predict job writes each image's top-5 and no boxes: the pages show its class,
    not "0 boxes", and the gallery's class filter keeps the images whose top-1 it is."""
    job = submit(bob, f"yolo predict model={pcb.reference} source=demo split=val", "predict")
    folder = job.run_dir / "predict"
    folder.mkdir(parents=True)
    results = []
    for n, (first, second) in enumerate((("cat", "dog"), ("dog", "cat"))):
        (folder / f"{n:05d}.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
        results.append({"image": f"{n:05d}.jpg", "source": f"val/{first}/{n}.png", "size": [32, 32], "boxes": [],
                        "top5": [{"class": 0, "name": first, "conf": 0.875}, {"class": 1, "name": second, "conf": 0.125}]})
    (folder / "predictions.json").write_text(json.dumps(results))
    job = succeed(job, {"mode": "predict", "folder": str(folder), "images": 2, "boxes": 0, "exports": []})
    html = page(bob, job)
    assert "val/cat/0.png · cat 0.88</figcaption>" in html and "2 images classified (top-5 classes each)" in html
    gallery = signed_in(bob).get(f"/jobs/{job.pk}/predictions/?class=dog").content.decode()
    assert "showing 1 of 2" in gallery and "val/dog/1.png" in gallery and "val/cat/0.png" not in gallery
    assert "· top-5" in gallery
