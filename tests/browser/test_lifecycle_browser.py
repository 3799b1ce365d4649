"""The lifecycle pages in a real browser: dataset upload (a zip and a folder) with its progress bar and
the dataset page, the prediction gallery, the compare page."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from PIL import Image, ImageDraw

from apps.datasets.models import Dataset
from apps.jobs.models import Job, JobState, MetricPoint
from apps.jobs.services import attempt_finish, job_submit
from apps.jobs.spec import parse_spec
from apps.registry.models import ModelVersion
from tests.datasets.archives import make_zip, valid_files

from .conftest import screenshot, sign_in
from .test_portal_browser import in_thread

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

DATASET_URL = re.compile(r".*/datasets/\d+/$")


def jpeg(path, color=(40, 120, 200)):
    image = Image.new("RGB", (96, 64), (235, 235, 235))
    ImageDraw.Draw(image).rectangle((20, 10, 60, 50), outline=color, width=3)
    image.save(path, "JPEG")


def slow_upload(page, bytes_per_s: int) -> None:
    """Throttle the browser's uploads (Chrome DevTools Protocol), so the progress bar has steps to show."""
    cdp = page.context.new_cdp_session(page)
    cdp.send("Network.enable")
    cdp.send("Network.emulateNetworkConditions", {"offline": False, "latency": 0, "downloadThroughput": -1,
                                                  "uploadThroughput": bytes_per_s})


def last_upload(page) -> dict:
    return json.loads(page.evaluate("sessionStorage.getItem('lastUpload')") or "{}")


def test_a_dataset_zip_uploads_with_progress_and_its_page_shows_counts_classes_and_boxes(live_portal, page, alice,
                                                                                        tmp_path):
    _, web = live_portal
    files = valid_files()
    for split in ("train", "val"):  # real images, big enough that a throttled upload takes a few steps
        for n in range(2):
            path = tmp_path / f"{split}{n}.jpg"
            Image.effect_noise((160, 120), 60).convert("RGB").save(path, "JPEG", quality=95)
            files.pop(f"images/{split}/{n}.png")
            files[f"images/{split}/{n}.jpg"] = path.read_bytes()
    archive = tmp_path / "pcb_defect.zip"
    archive.write_bytes(make_zip(files))
    sign_in(page, web.url, "alice", "pw-alice")
    page.goto(f"{web.url}/datasets/")
    page.set_input_files("#upload-file", str(archive))
    assert page.input_value("#upload-name") == "pcb_defect"
    slow_upload(page, max(archive.stat().st_size // 3, 4096))
    page.click("#upload-button")
    page.wait_for_url(DATASET_URL, timeout=30_000)
    stats = last_upload(page)
    assert stats["status"] == 201 and stats["percents"][-1] == 100
    assert any(0 < p < 100 for p in stats["percents"]), stats["percents"]

    assert page.inner_text("#image-count") == "4"
    assert "0: scratch" in page.inner_text("#class-names") and "1: dent" in page.inner_text("#class-names")
    page.wait_for_function("document.getElementById('histogram').dataset.bars === '4'")
    assert page.locator("#samples figure").count() == 2
    assert page.locator("#samples svg rect").count() == 4
    page.wait_for_function("Array.from(document.querySelectorAll('#samples img')).every(i => i.naturalWidth > 0)")
    screenshot(page, "20-dataset-page")
    assert page.errors == []


def test_a_dropped_folder_is_zipped_in_the_browser_and_becomes_the_next_version(live_portal, page, alice, tmp_path):
    _, web = live_portal
    folder = tmp_path / "pcb_defect"
    for relative, data in valid_files().items():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_bytes(data)
    (folder / "labels" / "train.cache").write_bytes(b"left out")
    sign_in(page, web.url, "alice", "pw-alice")
    for expected in (1, "unchanged", 2):
        if expected == 2:  # one more box: new files
            (folder / "labels" / "val" / "0.txt").write_bytes(b"1 0.5 0.5 0.1 0.1\n")
        page.goto(f"{web.url}/datasets/")
        page.set_input_files("#upload-folder", str(folder))
        page.click("#upload-button")
        if expected == "unchanged":  # the same files again: no version, the page says so and stays
            page.wait_for_selector("#upload-unchanged", timeout=30_000)
            assert "unchanged: pcb_defect:v1 already holds exactly these files" in page.inner_text("#upload-status")
            assert page.get_attribute("#upload-unchanged", "href") == f"/datasets/{Dataset.objects.get(name='pcb_defect', version=1).pk}/"
            continue
        page.wait_for_url(DATASET_URL, timeout=30_000)
        assert last_upload(page)["status"] == 201
        assert f":v{expected}" in page.inner_text("h1")
    dataset = Dataset.objects.get(name="pcb_defect", version=2)
    assert dataset.num_images == 4 and dataset.team.slug == "vision"
    screenshot(page, "21-dataset-folder-v2")


def test_a_refused_upload_lists_each_problem(live_portal, page, alice, tmp_path):
    _, web = live_portal
    archive = tmp_path / "bad.zip"
    archive.write_bytes(make_zip(valid_files() | {"labels/val/0.txt": b"9 0.5 0.5 0.1 0.1\n"}))
    sign_in(page, web.url, "alice", "pw-alice")
    page.goto(f"{web.url}/datasets/")
    page.set_input_files("#upload-file", str(archive))
    page.click("#upload-button")
    page.wait_for_selector("#upload-problems li")
    assert "labels/val/0.txt" in page.inner_text("#upload-problems")
    assert "refused (400)" in page.inner_text("#upload-status")


def trained(user, task_name: str, epochs: int, final: float, content: bytes) -> ModelVersion:
    document = {"task_name": task_name, "command": f"yolo train data=demo model=yolov8n.yaml epochs={epochs}",
                "user": "vision", "allow_duplicate": True}
    job, _ = job_submit(user=user, spec=parse_spec(document))
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING)
    job.refresh_from_db()
    weights = job.run_dir / "train" / "weights" / "best.pt"
    weights.parent.mkdir(parents=True, exist_ok=True)
    weights.write_bytes(content)
    for epoch in range(1, epochs + 1):
        MetricPoint.objects.create(job=job, epoch=epoch, attempt=1, seq=epoch, values={
            "metrics/mAP50-95(B)": final * epoch / epochs, "val/box_loss": 3.0 / epoch, "train/box_loss": 3.5 / epoch})
    attempt_finish(job, outcome="succeeded", exit_code=0, finished={
        "mode": "train", "weights": str(weights), "metrics": {"metrics/mAP50-95(B)": final, "metrics/mAP50(B)": final * 1.5}})
    return ModelVersion.objects.get(job=job)


def test_the_compare_page_overlays_the_curves_of_the_versions(live_portal, page, alice, bob):
    _, web = live_portal
    first = in_thread(trained, bob, "pcb", 3, 0.2, b"a")
    second = in_thread(trained, bob, "pcb", 5, 0.35, b"b")
    sign_in(page, web.url, "alice", "pw-alice")
    page.goto(f"{web.url}/models/")
    page.check(f"#model-{first.pk} .compare-pick")
    page.check(f"#model-{second.pk} .compare-pick")
    page.click("#compare-button")
    page.wait_for_selector("#compare-table")
    head = page.text_content("#compare-table thead")
    assert "pcb:v1" in head and "pcb:v2" in head
    assert page.locator("#compare-table td.best").all_inner_texts() == ["0.525", "0.350"]  # mAP50, mAP50-95 of v2
    page.wait_for_function("window.compareCharts && window.compareCharts.length === 3")
    assert page.get_attribute("canvas[data-series='mAP50-95']", "data-lines") == "2"
    assert page.get_attribute("canvas[data-series='mAP50-95']", "data-points") == "8"
    screenshot(page, "22-compare")
    assert page.errors == []


def test_the_prediction_gallery_shows_the_annotated_images(live_portal, page, alice, bob, tmp_path):
    from django.conf import settings

    _, web = live_portal
    version = in_thread(trained, bob, "pcb", 1, 0.1, b"w")

    def predicted():
        document = {"task_name": "predict", "command": f"yolo predict model={version.reference} source=demo",
                    "user": "vision"}
        job, _ = job_submit(user=bob, spec=parse_spec(document))
        folder = settings.JOBS_DIR / str(job.pk) / "predict"
        folder.mkdir(parents=True)
        results = []
        for n, color in enumerate([(200, 30, 30), (30, 160, 30), (30, 30, 200)]):
            jpeg(folder / f"{n:05d}.jpg", color)
            results.append({"image": f"{n:05d}.jpg", "source": f"images/val/val_{n:05d}.jpg", "size": [96, 64],
                            "boxes": [{"class": n, "name": ["rectangle", "circle", "triangle"][n], "conf": 0.8,
                                       "xyxy": [20, 10, 60, 50]}]})
        (folder / "predictions.json").write_text(json.dumps(results))
        Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING)
        job.refresh_from_db()
        attempt_finish(job, outcome="succeeded", exit_code=0,
                       finished={"mode": "predict", "folder": str(folder), "images": 3, "boxes": 3})
        return job

    job = in_thread(predicted)
    sign_in(page, web.url, "alice", "pw-alice")
    page.goto(f"{web.url}/jobs/{job.pk}/")
    page.click("#gallery-link")
    page.wait_for_selector("#gallery figure")
    assert page.locator("#gallery figure").count() == 3
    page.wait_for_function("Array.from(document.querySelectorAll('#gallery img')).every(i => i.naturalWidth === 96)")
    assert "images/val/val_00001.jpg" in page.inner_text("#gallery") and "circle" in page.inner_text("#gallery")
    page.select_option("select[name=class]", "triangle")
    page.wait_for_function("document.querySelectorAll('#gallery figure').length === 1")
    screenshot(page, "23-prediction-gallery")
    assert page.errors == []
    shutil.rmtree(settings.JOBS_DIR / str(job.pk), ignore_errors=True)


def test_a_predict_job_page_counts_images_live_and_shows_them_when_it_ends(live_portal, page, alice, bob, node):
    """No curves on a predict job's page: its progress and state still arrive over the socket, and its
    results section is fetched when it ends."""
    from django.conf import settings

    from apps.jobs.services import attempt_event_record, job_transition

    _, web = live_portal
    version = in_thread(trained, bob, "pcb", 1, 0.1, b"w")

    def running():
        document = {"task_name": "predict", "command": f"yolo predict model={version.reference} source=demo",
                    "user": "vision"}
        job, _ = job_submit(user=bob, spec=parse_spec(document))
        job_transition(job.pk, expected=[JobState.QUEUED], to=JobState.RUNNING, node=node, gpu_indices=[0])
        return Job.objects.get(pk=job.pk)

    def succeeded(job):
        folder = settings.JOBS_DIR / str(job.pk) / "predict"
        folder.mkdir(parents=True)
        results = []
        for n, color in enumerate([(200, 30, 30), (30, 160, 30)]):
            jpeg(folder / f"{n:05d}.jpg", color)
            results.append({"image": f"{n:05d}.jpg", "source": f"images/val/val_{n:05d}.jpg", "size": [96, 64],
                            "boxes": [{"class": n, "name": ["rectangle", "circle"][n], "conf": 0.8,
                                       "xyxy": [20, 10, 60, 50]}]})
        (folder / "predictions.json").write_text(json.dumps(results))
        attempt_finish(job, outcome="succeeded", exit_code=0,
                       finished={"mode": "predict", "folder": str(folder), "images": 2, "boxes": 2})

    job = in_thread(running)
    sign_in(page, web.url, "alice", "pw-alice")
    page.goto(f"{web.url}/jobs/{job.pk}/")
    page.wait_for_function("window.jobPage.live()")
    assert page.locator("canvas").count() == 0 and page.locator("#epochs-done").count() == 0
    assert "will be here when the job has finished" in page.inner_text("#outcome")

    in_thread(attempt_event_record, job, {"type": "progress", "done": 1, "total": 2})
    page.wait_for_selector("#predict-progress:not(.hidden)")
    assert page.inner_text("#predict-progress").startswith("1 of 2 images annotated")

    in_thread(succeeded, job)
    page.wait_for_selector("#outcome[data-loaded=true]", timeout=10_000)
    assert page.inner_text("#state") == "succeeded"
    assert "2 images annotated, 2 boxes" in page.inner_text("#prediction-summary")
    page.wait_for_function("Array.from(document.querySelectorAll('#prediction-previews img'))"
                           ".map(i => i.naturalWidth).join() === '96,96'")
    screenshot(page, "24-predict-job")
    assert page.errors == []
    shutil.rmtree(settings.JOBS_DIR / str(job.pk), ignore_errors=True)
