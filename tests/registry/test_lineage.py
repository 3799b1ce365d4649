"""The registry's promises: lineage recorded, stages managed and audited, version numbers never reused,
downloads re-checked against the stored sha256, the compare page and the prediction gallery."""

from __future__ import annotations

import hashlib
import json
from html import unescape as html_unescape

import pytest
from django.test import Client

from apps.accounts.models import AuditEntry
from apps.datasets.models import Dataset
from apps.jobs.models import Job, JobState
from apps.jobs.services import attempt_finish
from apps.registry.models import PredictionRun
from apps.registry.services import model_version_delete
from tests.conftest import api_client
from tests.registry.conftest import finish_training, train

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("stores")]


def page(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def base(bob, demo_registered):
    """v1 trained from scratch on the demo dataset."""
    return finish_training(train(bob, "yolo train data=demo model=yolov8n.yaml epochs=2"))


def test_a_trained_version_records_its_dataset_spec_and_code(base):
    lineage = base.lineage
    assert lineage["dataset"]["name"] == "demo" and len(lineage["dataset"]["sha256"]) == 64
    assert lineage["dataset"]["version"] == base.dataset.version
    assert lineage["parent"] == {"kind": "yaml", "name": "yolov8n.yaml"}
    assert lineage["spec"]["train_args"]["epochs"] == 2 and "resolved" not in lineage["spec"]
    assert lineage["code"] == {"torch": "2.x", "ultralytics": "8.4"}
    assert base.weights_key == f"jobs/{base.job_id}/train/weights/best.pt"
    assert base.sha256 == hashlib.sha256(b"weights").hexdigest()


def test_a_fine_tune_records_its_parent_version_with_its_hash(bob, base):
    child = finish_training(train(bob, f"yolo train data=demo model={base.reference} epochs=1", "pcb-ft"), b"child")
    assert child.parent == base
    assert child.lineage["parent"] == {"kind": "version", "id": base.pk, "team": "vision", "name": "pcb",
                                       "version": 1, "sha256": base.sha256}


def test_version_numbers_are_never_reused_after_a_delete(bob, base, alice):
    second = finish_training(train(bob, "yolo train data=demo model=yolov8n.yaml epochs=2"), b"2")
    model_version_delete(version=second, by=alice)
    third = finish_training(train(bob, "yolo train data=demo model=yolov8n.yaml epochs=2"), b"3")
    assert (base.version, second.version, third.version) == (1, 2, 3)


def test_a_manager_promotes_through_the_stages_and_every_move_is_audited(base, alice):
    client = api_client(alice)
    for stage in ("staging", "production"):
        response = client.post(f"/api/v1/models/{base.pk}/stage/", {"stage": stage}, format="json")
        assert response.status_code == 200, response.content
    base.refresh_from_db()
    assert base.stage == "production"
    moves = [(e.data["from"], e.data["to"]) for e in AuditEntry.objects.filter(action="model.promote")
             .order_by("created_at", "id")]
    assert moves == [("none", "staging"), ("staging", "production")]


def test_a_new_production_version_archives_the_previous_one(bob, alice, base):
    second = finish_training(train(bob, "yolo train data=demo model=yolov8n.yaml epochs=2"), b"2")
    client = api_client(alice)
    for version in (base, second):
        client.post(f"/api/v1/models/{version.pk}/stage/", {"stage": "staging"}, format="json")
        client.post(f"/api/v1/models/{version.pk}/stage/", {"stage": "production"}, format="json")
    base.refresh_from_db()
    second.refresh_from_db()
    assert (base.stage, second.stage) == ("archived", "production")
    assert AuditEntry.objects.filter(action="model.promote", data__to="archived", target_id=str(base.pk)).exists()
    spec = train(bob, "yolo val model=pcb:production data=demo").spec
    assert spec["inputs"]["model"]["version"] == 2


def test_a_member_may_not_promote_and_a_skipped_stage_is_named(base, bob, alice):
    assert api_client(bob).post(f"/api/v1/models/{base.pk}/stage/", {"stage": "staging"},
                                format="json").status_code == 403
    response = api_client(alice).post(f"/api/v1/models/{base.pk}/stage/", {"stage": "production"}, format="json")
    assert response.status_code == 400 and "can move to archived, staging" in response.json()["stage"][0]
    assert "is in no stage yet;" in response.json()["stage"][0]
    assert page(bob).post(f"/models/{base.pk}/stage/", {"stage": "staging"}).status_code == 302
    base.refresh_from_db()
    assert base.stage == "none"


def test_a_download_re_checks_the_stored_sha256(base, bob, stores):
    client = api_client(bob)
    response = client.get(f"/api/v1/models/{base.pk}/download/")
    assert response.status_code == 200 and b"".join(response.streaming_content) == b"weights"
    assert response["Content-Type"] == "application/octet-stream"  # not a guess from ".pt"
    assert response["X-Weights-SHA256"] == base.sha256  # what it was checked against, for yoloq model pull (H13)
    weights = client.get(f"/api/v1/jobs/{base.job_id}/weights/")
    assert weights.status_code == 200 and weights["Content-Type"] == "application/octet-stream"
    (stores.JOBS_DIR / str(base.job_id) / "train" / "weights" / "best.pt").write_bytes(b"tampered")
    response = client.get(f"/api/v1/models/{base.pk}/download/")
    assert response.status_code == 409 and "sha256" in response.json()["detail"]
    assert client.get(f"/api/v1/jobs/{base.job_id}/weights/").status_code == 409


def test_an_export_download_re_checks_its_sha256_too(base, bob, stores):
    from apps.registry.services import export_record

    onnx = stores.JOBS_DIR / str(base.job_id) / "export" / "best.onnx"
    onnx.parent.mkdir(parents=True)
    onnx.write_bytes(b"onnx")
    export = export_record(job=base.job, version=base, exported={
        "format": "onnx", "path": str(onnx), "verification": {"max_abs": 1e-5, "max_rel": 1e-7, "passed": True}})
    assert export.key.startswith(f"models/vision/pcb/v1/exports/{base.job_id}/")
    client = api_client(bob)
    response = client.get(f"/api/v1/exports/{export.pk}/download/")
    assert response.status_code == 200 and response["Content-Type"] == "application/octet-stream"
    assert response["X-Export-SHA256"] == export.sha256 != ""  # for yoloq export pull (CI trial 17, H13)
    (stores.MODELS_DIR / export.key.removeprefix("models/")).write_bytes(b"evil")
    assert client.get(f"/api/v1/exports/{export.pk}/download/").status_code == 409


def test_the_compare_page_shows_metrics_lineage_and_curves_side_by_side(bob, base):
    child = finish_training(train(bob, f"yolo train data=demo model={base.reference} epochs=3", "pcb-ft"), b"c",
                            metrics={"metrics/mAP50-95(B)": 0.4}, epochs=3)
    response = page(bob).get(f"/models/compare/?ids={base.pk},{child.pk}")
    assert response.status_code == 200
    html = response.content.decode()
    assert "pcb:v1" in html and "pcb-ft:v1" in html and "metrics/mAP50-95(B)" in html
    assert 'class="best">0.400' in html and "demo:v" in html
    curves = json.loads(html.split('id="compare-data" type="application/json">')[1].split("</script>")[0])
    assert [len(s) for s in curves["series"]["mAP50-95"]] == [2, 3]


@pytest.mark.parametrize("ids", ["", "1", "1,2,3,4,5"])
def test_compare_needs_two_to_four_versions(ids, bob, base):
    response = page(bob).get(f"/models/compare/?ids={ids}")
    assert response.status_code in (400, 404)


def test_compare_of_another_teams_version_is_a_404(base, carol):
    assert page(carol).get(f"/models/compare/?ids={base.pk},{base.pk}").status_code == 404


def test_the_model_page_shows_lineage_and_the_stage_buttons_to_managers_only(base, bob, alice):
    html = page(alice).get(f"/models/{base.pk}/").content.decode()
    assert "Promote to staging" in html and "demo:v" in html and "yolov8n.yaml" in html
    assert "Promote to staging" not in page(bob).get(f"/models/{base.pk}/").content.decode()


def test_a_production_version_is_moved_back_to_staging_not_promoted(base, alice):
    """A production version's page offered "Promote to staging" (a trial): that move is a step back."""
    from apps.registry.services import model_stage_set

    model_stage_set(version=base, stage="staging", by=alice)
    model_stage_set(version=base, stage="production", by=alice)
    html = page(alice).get(f"/models/{base.pk}/").content.decode()
    assert "Back to staging" in html and "Promote to" not in html and "Archive" in html
    model_stage_set(version=base, stage="archived", by=alice)
    html = page(alice).get(f"/models/{base.pk}/").content.decode()
    assert "Restore to staging" in html and "Promote to" not in html


def test_the_model_page_opens_a_val_predict_or_export_job_of_it_ready_to_submit(base, bob, carol):
    """The model page had no way to evaluate, predict or export: only a hint to type the command in
    the YAML tab (a trial)."""
    client = page(bob)
    html = client.get(f"/models/{base.pk}/").content.decode()
    for use in ("val", "predict", "export"):
        assert f'href="/jobs/new/?model={base.pk}&amp;use={use}"' in html
    data = base.dataset.reference
    expected = {"val": f"yolo val model={base.reference} data={data} split=val",
                "predict": f"yolo predict model={base.reference} source={data}",
                "export": f"yolo export model={base.reference} format=onnx"}
    for use, command in expected.items():
        form = client.get(f"/jobs/new/?model={base.pk}&use={use}").content.decode()
        assert command in html_unescape(form), form[:2000]

    spec = html_unescape(client.get(f"/jobs/new/?model={base.pk}&use=val").content.decode())
    text = spec.split('name="y-spec_text"')[1].split(">", 1)[1].split("</textarea>")[0]
    response = client.post("/jobs/new/", {"mode": "yaml", "y-spec_text": text.strip() + "\n"})
    assert response.status_code == 302, html_unescape(response.content.decode())[:3000]
    job = Job.objects.get(pk=response["Location"].split("/")[2])
    assert job.spec["mode"] == "val" and job.team.slug == base.team.slug
    assert client.get(f"/jobs/new/?model={base.pk}&use=train").status_code == 404
    assert page(carol).get(f"/jobs/new/?model={base.pk}&use=val").status_code == 404


def test_the_model_page_names_a_deleted_training_dataset_without_linking_to_a_404(base, alice, bob):
    from apps.datasets.services import dataset_delete

    dataset = base.dataset
    assert f'href="/datasets/{dataset.pk}/"' in page(bob).get(f"/models/{base.pk}/").content.decode()
    dataset_delete(dataset=dataset, by=alice)

    html = page(bob).get(f"/models/{base.pk}/").content.decode()

    assert f'href="/datasets/{dataset.pk}/"' not in html and 'id="dataset-gone">(deleted)' in html


def test_the_prediction_gallery_shows_each_annotated_image_with_its_boxes(bob, base, stores):
    job = train(bob, "yolo predict model=pcb:v1 source=demo")
    folder = stores.JOBS_DIR / str(job.pk) / "predict"
    folder.mkdir(parents=True)
    results = []
    for n in range(3):
        (folder / f"{n:05d}.jpg").write_bytes(b"\xff\xd8jpg")
        results.append({"image": f"{n:05d}.jpg", "source": f"images/val/{n}.jpg", "size": [64, 64],
                        "boxes": [{"class": 0, "name": "rectangle", "conf": 0.9, "xyxy": [1, 2, 3, 4]}] * n})
    (folder / "predictions.json").write_text(json.dumps(results))
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING)
    job.refresh_from_db()
    attempt_finish(job, outcome="succeeded", exit_code=0,
                   finished={"mode": "predict", "folder": str(folder), "images": 3, "boxes": 3})
    run = PredictionRun.objects.get(job=job)
    assert (run.version, run.images, run.boxes) == (base, 3, 3)
    html = page(bob).get(f"/jobs/{job.pk}/predictions/").content.decode()
    assert html.count('class="prediction"') == 3 and "images/val/2.jpg" in html
    assert page(bob).get(f"/jobs/{job.pk}/predictions/?class=rectangle").content.decode().count(
        'class="prediction"') == 2
    image = api_client(bob).get(f"/api/v1/jobs/{job.pk}/predictions/1/image/")
    assert image.status_code == 200 and image["Content-Type"] == "image/jpeg"
    body = api_client(bob).get(f"/api/v1/jobs/{job.pk}/predictions/").json()
    assert body["boxes"] == 3 and body["results"][2]["url"].endswith("/predictions/2/image/")


def test_no_predictions_yet_says_why_to_the_team_and_nothing_to_an_outsider(bob, carol, base, stores):
    """A queued predict job's or a training's predictions answered "No predictions for that job in
    your teams." to their own submitter, who read it as "not your job" (new-user trial 27, F3)."""
    job = train(bob, "yolo predict model=pcb:v1 source=demo")
    for path in (f"/api/v1/jobs/{job.pk}/predictions/", f"/api/v1/jobs/{job.pk}/predictions/0/image/"):
        response = api_client(bob).get(path)
        assert response.status_code == 404
        assert response.json()["detail"] == f"pcb ({str(job.pk)[:8]}) is queued: its predictions are here once it " \
                                            "has succeeded."
    Job.objects.filter(pk=job.pk).update(state=JobState.FAILED)
    assert "keeps its predictions only when it succeeds" in api_client(bob).get(
        f"/api/v1/jobs/{job.pk}/predictions/").json()["detail"]
    training = base.job
    assert "is a train job: only a predict job" in api_client(bob).get(
        f"/api/v1/jobs/{training.pk}/predictions/").json()["detail"]
    export = train(bob, "yolo export model=pcb:v1 format=onnx")  # "is a export job" (trial 32)
    assert "is an export job: only a predict job" in api_client(bob).get(
        f"/api/v1/jobs/{export.pk}/predictions/").json()["detail"]
    outsider = api_client(carol).get(f"/api/v1/jobs/{job.pk}/predictions/")
    assert (outsider.status_code, outsider.json()["detail"]) == (404, "No predictions for that job in your teams.")


def test_the_stage_endpoint_answers_the_version_with_what_else_it_changed(bob, alice, base):
    """Trial 14, F16: the 200 was a list of every version changed."""
    second = finish_training(train(bob, "yolo train data=demo model=yolov8n.yaml epochs=2"), b"2")
    client = api_client(alice)
    for stage in ("staging", "production"):
        client.post(f"/api/v1/models/{base.pk}/stage/", {"stage": stage}, format="json")
    client.post(f"/api/v1/models/{second.pk}/stage/", {"stage": "staging"}, format="json")
    body = client.post(f"/api/v1/models/{second.pk}/stage/", {"stage": "production"}, format="json").json()
    assert isinstance(body, dict)
    assert (body["id"], body["stage"], body["reference"]) == (second.pk, "production", second.reference)
    assert body["stage_changed_at"] and "lineage" in body  # the same object as GET models/{id}/
    assert [(v["id"], v["stage"]) for v in body["also_changed"]] == [(base.pk, "archived")]


def test_a_manager_moves_stages_in_admin_through_the_same_rules_and_audit(bob, alice, base):
    """Trial 14, F16: admin offered only delete for model versions."""
    type(alice).objects.filter(pk=alice.pk).update(is_staff=True)
    client = page(alice)
    assert 'value="to_staging"' not in page(bob).get("/admin/registry/modelversion/").content.decode()
    listing = client.get("/admin/registry/modelversion/").content.decode()
    assert 'value="to_production"' in listing and 'value="to_archived"' in listing
    selected = {"_selected_action": [str(base.pk)]}
    html = client.post("/admin/registry/modelversion/", {"action": "to_production", **selected},
                       follow=True).content.decode()
    assert "can move to archived, staging" in html  # none → production is refused as in the API
    base.refresh_from_db()
    assert base.stage == "none"
    html = client.post("/admin/registry/modelversion/", {"action": "to_staging", **selected},
                       follow=True).content.decode()
    assert f"Moved: {base} → staging" in html
    client.post("/admin/registry/modelversion/", {"action": "to_production", **selected})
    client.post("/admin/registry/modelversion/", {"action": "to_archived", **selected})
    base.refresh_from_db()
    assert base.stage == "archived"
    moves = [(e.data["from"], e.data["to"], e.actor_id) for e in AuditEntry.objects.filter(action="model.promote")
             .order_by("created_at", "id")]
    assert moves == [("none", "staging", alice.pk), ("staging", "production", alice.pk),
                     ("production", "archived", alice.pk)]


def test_admin_promotes_one_version_of_a_model_to_production_at_a_time(bob, alice, base):
    """Two selected: the second archived the first and the message said the opposite (manager trial 15, F19)."""
    second = finish_training(train(bob, "yolo train data=demo model=yolov8n.yaml epochs=2"), b"2")
    client = api_client(alice)
    for version, stage in ((base, "staging"), (base, "production"), (second, "staging")):
        client.post(f"/api/v1/models/{version.pk}/stage/", {"stage": stage}, format="json")
    type(alice).objects.filter(pk=alice.pk).update(is_staff=True)
    html = page(alice).post("/admin/registry/modelversion/", {
        "action": "to_production", "_selected_action": [str(base.pk), str(second.pk)]}, follow=True).content.decode()
    assert f"2 versions of {base.name} selected (v{base.version}, v{second.version}): one version holds " \
           "production, select one" in html
    base.refresh_from_db()
    second.refresh_from_db()
    assert (base.stage, second.stage) == ("production", "staging")


@pytest.mark.parametrize(("task_name", "name"), [("portal ft", "portal-ft"), ("pcb (night) + aug", "pcb-night-aug"),
                                                 ("détection:v2", "detection-v2"), ("(((", "model")])
def test_a_task_name_a_spec_cannot_name_registers_as_one_it_can(bob, demo_registered, task_name, name):
    """Trial 20: the portal form's task name "portal ft" registered "portal ft:v1", which every spec
    refused (`model=` takes no spaces); the version is named so that the next job can start from it."""
    version = finish_training(train(bob, "yolo train data=demo model=yolov8n.yaml epochs=2", task_name))
    assert version.name == name
    job = train(bob, f"yolo val model={version.reference} data=demo")
    assert job.spec["inputs"]["model"]["id"] == version.pk


def test_a_stage_that_is_no_stage_is_refused_naming_the_stages(base, alice):
    """Trial 20: `yoloq model stage 1 prod` printed only '"prod" is not a valid choice.'."""
    response = api_client(alice).post(f"/api/v1/models/{base.pk}/stage/", {"stage": "prod"}, format="json")
    assert response.status_code == 400
    assert response.json() == {"stage": ["must be one of none, staging, production, archived, got 'prod'"]}


def test_a_model_name_with_a_typo_is_told_the_closest_names(bob, base):
    """Trial 20: `model=pbc:v1` said only "no registered model 'pbc:v1' in your team"."""
    document = {"task_name": "t", "command": "yolo val model=pbc:v1 data=demo", "user": "vision"}
    response = api_client(bob).post("/api/v1/jobs/", document, format="json")
    assert response.json()["command.model"] == [
        "no registered model 'pbc:v1' in your team; did you mean pcb? (yoloq model list)"]


def val_without_data(user, reference: str):
    document = {"task_name": "v", "command": f"yolo val model={reference}", "user": "vision"}
    return api_client(user).post("/api/v1/jobs/", document, format="json")


def test_a_val_without_data_validates_on_the_dataset_the_model_was_trained_on_and_says_so(bob, base):
    """Trial30: `yolo val model=pcb:v1` (Ultralytics reads the model's own data.yaml) was refused
    "command.data: is required" even for a model trained here, whose dataset the registry records."""
    response = val_without_data(bob, base.reference)
    assert response.status_code == 201, response.content
    spec = response.json()["spec"]
    assert spec["train_args"]["data"] == base.dataset.reference
    assert spec["inputs"]["data"]["id"] == base.dataset_id
    assert spec["inputs"]["data"]["chosen"] == (
        f"no data= given: {base.dataset.reference}, the dataset model {base.reference} was trained on")
    job = Job.objects.get(pk=response.json()["id"])
    assert job.spec["resolved"]["data_yaml"] == base.dataset.yaml_key


def test_a_val_on_a_split_without_labels_is_refused_naming_the_split(bob, base, tmp_path):
    """Trial 31: a dataset whose val images have no label files was stored (its stats say 0 labels) and
    `yolo val` on it succeeded with "mAP50-95 0 … 0 classes" recorded as the model's evaluation, where
    Ultralytics itself says "no labels found …, cannot compute metrics without labels"."""
    from django.conf import settings

    from apps.datasets.demo import generate_demo_dataset
    from apps.datasets.services import dataset_register

    data_yaml = generate_demo_dataset(settings.DATASETS_DIR / "_shared" / "unlabelled", train=4, val=2)
    for label in (data_yaml.parent / "labels" / "val").glob("*.txt"):
        label.unlink()
    dataset_register(team=base.team, name="unlabelled", yaml_path=data_yaml)
    document = {"task_name": "v", "command": f"yolo val model={base.reference} data=unlabelled", "user": "vision"}
    response = api_client(bob).post("/api/v1/jobs/", document, format="json")
    assert response.status_code == 400, response.content
    assert response.json() == {"command.split": [
        "the 'val' split of dataset unlabelled:v1 has no labels (2 images, none with a labelled object): every "
        "metric would be 0; validate on a split with labels (split=train) or upload the val labels"]}
    document["command"] += " split=train"
    assert api_client(bob).post("/api/v1/jobs/", document, format="json").status_code == 201


def test_a_training_validating_on_a_split_without_labels_is_refused_naming_it_unless_val_is_false(bob, base):
    """trial31 left: T2 refused only `yolo val`; a training validates on the val split each epoch (Ultralytics),
    so on one without labels every epoch's mAP was 0 and best.pt was chosen by those zeros."""
    from django.conf import settings

    from apps.datasets.demo import generate_demo_dataset
    from apps.datasets.services import dataset_register

    data_yaml = generate_demo_dataset(settings.DATASETS_DIR / "_shared" / "unlabelled", train=4, val=2)
    for label in (data_yaml.parent / "labels" / "val").glob("*.txt"):
        label.unlink()
    dataset_register(team=base.team, name="unlabelled", yaml_path=data_yaml)
    document = {"task_name": "t", "command": "yolo train model=yolov8n.yaml data=unlabelled epochs=1 imgsz=64",
                "user": "vision"}
    response = api_client(bob).post("/api/v1/jobs/", document, format="json")
    assert response.status_code == 400, response.content
    assert response.json() == {"command.data": [
        "the 'val' split of dataset unlabelled:v1 has no labels (2 images, none with a labelled object): a training "
        "validates on it every epoch, so every metric would be 0 and best.pt chosen by those zeros; upload the val "
        "labels, or train with val=false (no validation during training; the last epoch's is still 0)"]}
    document["command"] += " val=false"
    assert api_client(bob).post("/api/v1/jobs/", document, format="json").status_code == 201


def test_a_val_without_data_of_a_model_whose_dataset_is_gone_names_the_field_and_why(bob, base):
    Dataset.objects.filter(pk=base.dataset_id).delete()
    response = val_without_data(bob, base.reference)
    assert response.status_code == 400
    assert response.json()["command.data"] == [
        f"is required: {base.reference} was trained on demo:v{base.lineage['dataset']['version']}, which is deleted, "
        "so give the dataset to validate on (data=NAME, one of your team's datasets; split=val by default)"]
    response = val_without_data(bob, "nosuch:v1")
    assert response.status_code == 400 and "command.model" in response.json()
    assert response.json()["command.data"][0].startswith("is required: give the dataset to validate on")


def test_a_val_without_data_retried_under_its_idempotency_key_is_the_same_job(bob, base):
    """`yoloq submit` retries a lost answer under the same Idempotency-Key (CI trial 17): a val left
    without data= was stored with the model's dataset filled in, and the retry, compared before that
    fill, was "a different request" (review31)."""
    document = {"task_name": "v", "command": f"yolo val model={base.reference}", "user": "vision"}
    client = api_client(bob)
    first = client.post("/api/v1/jobs/", document, format="json", HTTP_IDEMPOTENCY_KEY="val-1")
    assert first.status_code == 201, first.content
    again = client.post("/api/v1/jobs/", document, format="json", HTTP_IDEMPOTENCY_KEY="val-1")
    assert again.status_code == 200, again.content
    assert again.json()["id"] == first.json()["id"]
    assert Job.objects.filter(task_name="v").count() == 1
    other = client.post("/api/v1/jobs/", {**document, "task_name": "w"}, format="json", HTTP_IDEMPOTENCY_KEY="val-1")
    assert other.status_code == 409, "the rest is still compared"


def test_compare_with_a_missing_id_names_that_id(bob, base, carol):
    """trial31: ``?ids=1,99999`` was "No model with that id in your teams." without naming 99999."""
    response = page(bob).get(f"/models/compare/?ids={base.pk},99999")
    assert response.status_code == 404
    assert "No model with id 99999 in your teams." in response.content.decode()
    response = page(carol).get(f"/models/compare/?ids={base.pk},99998,{2**63}")
    assert response.status_code == 404
    assert f"No models with ids {base.pk}, 99998, {2**63} in your teams." in response.content.decode()


def test_compare_with_an_id_of_thousands_of_digits_is_a_404_naming_it_shortened(bob, base):
    """Python refuses int() of a string over 4300 digits (ValueError): the compare page's id parse was a
    500 (review32). Named as any missing id, shortened."""
    huge = "9" * 5000
    response = page(bob).get(f"/models/compare/?ids={base.pk},{huge}")
    assert response.status_code == 404
    assert f"No model with id {'9' * 20}… in your teams." in response.content.decode()


def test_compare_with_many_missing_ids_names_the_first_few_and_counts_them(bob, base):
    """The 404 named every missing id: a URL of hundreds was a message of hundreds (review32)."""
    missing = list(range(90001, 90301))
    response = page(bob).get(f"/models/compare/?ids={base.pk},{','.join(map(str, missing))}")
    assert response.status_code == 404
    body = response.content.decode()
    assert "No models with ids 90001, 90002, 90003, 90004, 90005 … (300 in all) in your teams." in body
    assert "90006" not in body
