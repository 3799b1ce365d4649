"""GET jobs/{id}/ of a succeeded val, predict or export job carries what it produced (new-user
trial 16, G2): the evaluation's metrics and where its per-class table is, the predictions' link,
the exported files' downloads. Recorded as the worker records them (tests/portal/test_job_modes.py)."""

from __future__ import annotations

import pytest

from apps.registry.models import Evaluation, Export
from tests.conftest import api_client
from tests.portal.test_job_modes import pcb, stores, submit, succeed  # noqa: F401 - fixtures

pytestmark = pytest.mark.django_db

VAL_METRICS = {"metrics/precision(B)": 0.71, "metrics/recall(B)": 0.52, "metrics/mAP50(B)": 0.634,
               "metrics/mAP50-95(B)": 0.412, "fitness": 0.43}


def val_job(bob, pcb):  # noqa: F811 - the fixture's value
    return succeed(submit(bob, f"yolo val model={pcb.reference} data=demo split=val", "val"), {
        "mode": "val", "split": "val", "exports": [], "metrics": VAL_METRICS, "speed": {},
        "per_class": [{"class": 0, "name": "rectangle", "images": 4, "instances": 5, "precision": 0.8,
                       "recall": 0.6, "map50": 0.7, "map50_95": 0.5}]})


def test_a_val_jobs_object_has_its_evaluation(bob, pcb):  # noqa: F811
    job = val_job(bob, pcb)

    outcome = api_client(bob).get(f"/api/v1/jobs/{job.pk}/").json()["outcome"]

    evaluation = Evaluation.objects.get(job=job)
    assert outcome["mode"] == "val"
    assert outcome["evaluation"] == {"id": evaluation.pk, "version": pcb.pk, "split": "val", "dataset": "demo:v1",
                                     "metrics": VAL_METRICS, "classes": 1, "url": f"models/{pcb.pk}/"}


def test_a_predict_jobs_object_links_its_predictions(bob, pcb):  # noqa: F811
    job = submit(bob, f"yolo predict model={pcb.reference} source=demo split=val", "predict")
    folder = job.run_dir / "predict"
    folder.mkdir(parents=True)
    (folder / "predictions.json").write_text("[]")
    job = succeed(job, {"mode": "predict", "folder": str(folder), "images": 3, "boxes": 7, "exports": []})

    outcome = api_client(bob).get(f"/api/v1/jobs/{job.pk}/").json()["outcome"]

    assert outcome["predictions"] == {"images": 3, "boxes": 7, "classified": False,
                                      "url": f"jobs/{job.pk}/predictions/"}


def test_an_export_jobs_object_has_its_files(bob, pcb):  # noqa: F811
    job = submit(bob, f"yolo export model={pcb.reference} format=onnx", "export")
    onnx = job.run_dir / "export" / "best.onnx"
    onnx.parent.mkdir(parents=True)
    onnx.write_bytes(b"onnx bytes")
    job = succeed(job, {"mode": "export", "exports": [{"format": "onnx", "path": str(onnx), "options": {},
                                                        "verification": {"passed": True}}]})

    outcome = api_client(bob).get(f"/api/v1/jobs/{job.pk}/").json()["outcome"]

    export = Export.objects.get(job=job)
    assert outcome["exports"] == [{"id": export.pk, "format": "onnx", "size": 10, "passed": True,
                                   "download": f"exports/{export.pk}/download/"}]


def test_an_unfinished_job_has_no_outcome_yet(bob, pcb):  # noqa: F811
    job = submit(bob, f"yolo val model={pcb.reference} data=demo split=val", "val")

    assert api_client(bob).get(f"/api/v1/jobs/{job.pk}/").json()["outcome"] is None


def test_an_export_jobs_weights_say_where_its_files_are_with_the_right_article(bob, pcb):  # noqa: F811
    """It said "A export job trains nothing, so it has no weights." and no more (CI trial 17, H13)."""
    job = submit(bob, f"yolo export model={pcb.reference} format=onnx", "export")

    response = api_client(bob).get(f"/api/v1/jobs/{job.pk}/weights/")

    assert response.status_code == 404
    assert response.json() == {"detail": "An export job trains nothing, so it has no weights; its exported files are "
                                         "in its outcome (outcome.exports, each with its download)."}
