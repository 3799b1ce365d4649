"""Continue an ended training job from its newest stored checkpoint, as a new job
(``POST jobs/{id}/continue/``, the job page's "Continue from epoch N": apps/jobs/continuation.py)."""

from __future__ import annotations

import hashlib
import html
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.core.artifacts import artifact_path
from apps.jobs.checkpoint_retention import checkpoints_housekeeping
from apps.jobs.models import Checkpoint, Job, JobEvent, JobState, MetricPoint
from apps.jobs.services import attempt_finish, attempt_start, job_claim, metrics_record
from apps.scheduling.estimates import job_estimates
from tests.conftest import SEED_SPEC, api_client
from tests.jobs.factories import stored_checkpoint as checkpoint

pytestmark = pytest.mark.django_db

SPEC = SEED_SPEC.replace("epochs=2", "epochs=5")


@pytest.fixture
def submit(alice, demo_registered, node, clean_storage):
    """Submit SPEC as ``user`` through the API and start its first attempt on node-a (run folders
    under the test's JOBS_DIR: the artifact storage's own root)."""

    def submit(user=alice, spec: str = SPEC) -> Job:
        response = api_client(user).post("/api/v1/jobs/", spec, content_type="application/yaml")
        assert response.status_code == 201, response.content
        job = Job.objects.get(pk=response.json()["id"])
        assert job_claim(job, node=node, gpu_indices=[0], gpu_share=1.0, run_class="medium")
        return attempt_start(job_id=job.pk, attempt_id=job.attempt_id, node_name="node-a")

    return submit




@pytest.fixture
def cancelled(submit):
    """A job of 5 epochs cancelled after epoch 3; epoch 2 is its best.pt."""
    job = submit()
    checkpoint(job, 1, best=True)
    checkpoint(job, 2, best=True)
    checkpoint(job, 3)
    assert attempt_finish(job, outcome="cancelled", exit_code=-15) == "cancelled"
    return Job.objects.get(pk=job.pk)


def test_it_queues_a_new_job_that_resumes_the_newest_checkpoint(cancelled, alice):
    response = api_client(alice).post(f"/api/v1/jobs/{cancelled.pk}/continue/")

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["id"] != str(cancelled.pk) and body["state"] == "queued" and body["attempt"] == 1
    assert body["spec"]["continued_from"] == {"job": str(cancelled.pk), "task_name": cancelled.task_name, "epoch": 3}
    assert body["epochs_done"] == 3 and body["epochs"] == 5 and body["timeout_s"] == cancelled.timeout_s
    new = Job.objects.get(pk=body["id"])
    rows = {row.epoch: row for row in Checkpoint.objects.filter(job=new)}
    assert sorted(rows) == [2, 3] and rows[2].best and not rows[3].best  # the newest, and the run's best.pt
    for epoch, row in rows.items():
        assert row.key == f"jobs/{new.pk}/checkpoints/epoch-{epoch:04d}.pt"
        old = Checkpoint.objects.get(job=cancelled, epoch=epoch)
        # Where the worker looks for it in the new job's run folder (worker/checkpoint_store.py).
        copy = new.run_dir / "checkpoints" / f"epoch-{epoch:04d}.pt"
        assert copy.read_bytes() == artifact_path(old.key).read_bytes() and row.sha256 == old.sha256
    assert JobEvent.objects.filter(job=cancelled, kind="continued", data__job=str(new.pk)).exists()
    assert "continues job" in JobEvent.objects.get(job=new, kind="submitted").message


def test_a_new_timeout_is_the_new_jobs(cancelled, alice):
    response = api_client(alice).post(f"/api/v1/jobs/{cancelled.pk}/continue/", {"timeout": 7200}, format="json")

    assert response.status_code == 201, response.content
    assert response.json()["timeout_s"] == 7200 and cancelled.timeout_s == 3600


def test_a_timeout_over_the_limit_is_refused_naming_it(cancelled, alice, settings):
    settings.MAX_JOB_TIMEOUT_S = 7200

    response = api_client(alice).post(f"/api/v1/jobs/{cancelled.pk}/continue/", {"timeout": 9000}, format="json")

    assert response.status_code == 400 and "the limit is 7200 s" in response.json()["timeout"][0]
    assert not Job.objects.exclude(pk=cancelled.pk).exists()
    assert not list((cancelled.run_dir.parent).glob("*/checkpoints/*.json"))  # the copies went again


@pytest.mark.parametrize("body", [{"timeout": "soon"}, {"timeout": 0}, {"epochs": 9},
                                  {"timeout": "abc", "bogus": 1}])  # both named at once (trial25)
def test_a_bad_body_is_refused_naming_the_field(cancelled, alice, body):
    response = api_client(alice).post(f"/api/v1/jobs/{cancelled.pk}/continue/", body, format="json")

    assert response.status_code == 400 and set(response.json()) == set(body)


def test_a_running_job_cannot_be_continued(submit, alice):
    job = submit()
    checkpoint(job, 1)

    response = api_client(alice).post(f"/api/v1/jobs/{job.pk}/continue/")

    assert response.status_code == 409
    assert response.json() == {"state": ["job is running; only an ended job (failed, cancelled or timed out) can "
                                         "be continued"]}


def test_a_succeeded_job_has_nothing_left_to_train(submit, alice):
    job = submit()
    checkpoint(job, 5)
    Job.objects.filter(pk=job.pk).update(state=JobState.SUCCEEDED)

    response = api_client(alice).post(f"/api/v1/jobs/{job.pk}/continue/")

    assert response.status_code == 409
    assert response.json()["state"] == ["job succeeded: nothing left to train; use its weights"]


def test_a_succeeded_jobs_refusal_names_the_model_to_train_on_from(submit, alice):
    """Trial 20: "use its weights" did not say how; the registered version's reference does."""
    job = submit()
    weights = job.run_dir / "train" / "weights" / "best.pt"
    weights.parent.mkdir(parents=True, exist_ok=True)
    weights.write_bytes(b"weights")
    finished = {"mode": "train", "weights": str(weights), "metrics": {}, "code": {}, "exports": []}
    assert attempt_finish(job, outcome="succeeded", exit_code=0, finished=finished) == "succeeded"
    reference = Job.objects.get(pk=job.pk).model_version.reference

    response = api_client(alice).post(f"/api/v1/jobs/{job.pk}/continue/")

    assert response.status_code == 409
    assert response.json()["state"] == [f"job succeeded: nothing left to train; use its weights (a new training "
                                        f"job with model={reference} starts from them)"]


def test_a_checkpoint_of_the_final_epoch_leaves_nothing_to_train(submit, alice):
    job = submit()
    checkpoint(job, 5)
    attempt_finish(job, outcome="failed", exit_code=1, error="export failed")

    response = api_client(alice).post(f"/api/v1/jobs/{job.pk}/continue/")

    assert response.status_code == 409
    assert response.json()["checkpoint"] == ["its checkpoint is of epoch 5, the last of 5: nothing left to train; "
                                             "use its weights"]


def test_a_job_cancelled_before_its_first_checkpoint_cannot_be_continued(submit, alice):
    job = submit()
    attempt_finish(job, outcome="cancelled", exit_code=-15)

    response = api_client(alice).post(f"/api/v1/jobs/{job.pk}/continue/")

    assert response.status_code == 409
    assert "no stored checkpoint to continue from: it ended before its first epoch did" in (
        response.json()["checkpoint"][0])


@pytest.mark.parametrize("memory", ["-1Gi", "lots"])
def test_a_bad_memory_is_named_before_the_job_s_own_refusal(submit, alice, memory):
    """The request's own field first (trial27 F11: the 409 about the checkpoint came before the 400 on
    memory, which a second try then got); a timeout of -1 already was a 400 first (the serializer)."""
    job = submit()
    attempt_finish(job, outcome="cancelled", exit_code=-15)

    response = api_client(alice).post(f"/api/v1/jobs/{job.pk}/continue/", {"memory": memory}, format="json")

    assert response.status_code == 400, response.content
    assert set(response.json()) == {"memory"} and "16Gi" in response.json()["memory"][0]


def test_a_job_cancelled_while_queued_never_started(alice, demo_registered, node, clean_storage):
    response = api_client(alice).post("/api/v1/jobs/", SPEC, content_type="application/yaml")
    api_client(alice).post(f"/api/v1/jobs/{response.json()['id']}/cancel/")

    response = api_client(alice).post(f"/api/v1/jobs/{response.json()['id']}/continue/")

    assert response.status_code == 409
    assert response.json() == {"checkpoint": ["the job has no stored checkpoint to continue from: it never started"]}


def test_a_val_job_is_not_a_training_job(submit, alice, cancelled):
    Job.objects.filter(pk=cancelled.pk).update(spec={**cancelled.spec, "mode": "val"})

    response = api_client(alice).post(f"/api/v1/jobs/{cancelled.pk}/continue/")

    assert response.status_code == 400
    assert response.json() == {"mode": ["the job is a val job: only a training job can be continued"]}


def test_an_outsider_gets_the_same_404_as_for_any_job(cancelled, carol):
    response = api_client(carol).post(f"/api/v1/jobs/{cancelled.pk}/continue/")

    assert response.status_code == 404
    assert response.json() == {"detail": "No job with that id in your teams."}


def test_continuing_twice_is_refused_as_a_duplicate_of_the_active_continuation(cancelled, alice):
    first = api_client(alice).post(f"/api/v1/jobs/{cancelled.pk}/continue/").json()

    response = api_client(alice).post(f"/api/v1/jobs/{cancelled.pk}/continue/")

    assert response.status_code == 409 and response.json()["job"]["id"] == first["id"]
    assert Job.objects.count() == 2


def _continued_and_ended(cancelled, alice, outcome: str, **headers) -> Job:
    """Continue ``cancelled`` through the API and end the continuation with ``outcome``."""
    response = api_client(alice).post(f"/api/v1/jobs/{cancelled.pk}/continue/", **headers)
    assert response.status_code == 201, response.content
    Job.objects.filter(pk=response.json()["id"]).update(state=outcome, finished_at=timezone.now())
    return Job.objects.get(pk=response.json()["id"])


def test_a_job_whose_continuation_succeeded_is_not_continued_again(cancelled, alice, client):
    """Trial 23: continuing it again trained the same epochs a second time (and its page still offered it)."""
    later = _continued_and_ended(cancelled, alice, JobState.SUCCEEDED)

    response = api_client(alice).post(f"/api/v1/jobs/{cancelled.pk}/continue/")

    assert response.status_code == 409
    assert response.json() == {"state": [f"job was continued as job {later.pk}, which succeeded: nothing left to "
                                         "train; use its weights"]}
    assert Job.objects.count() == 2
    client.force_login(alice)
    assert 'id="continue-button"' not in client.get(f"/jobs/{cancelled.pk}/").content.decode()


def test_a_job_whose_continuation_was_cancelled_is_continued_from_that_one(cancelled, alice):
    later = _continued_and_ended(cancelled, alice, JobState.CANCELLED)

    response = api_client(alice).post(f"/api/v1/jobs/{cancelled.pk}/continue/")

    assert response.status_code == 409
    assert response.json() == {"state": [f"job was continued as job {later.pk}, which was cancelled: continue that "
                                         "one (it resumes from the same checkpoint or a newer one)"]}
    assert api_client(alice).post(f"/api/v1/jobs/{later.pk}/continue/").status_code == 201


def test_a_replay_of_the_continue_request_still_returns_its_job_once_it_has_ended(cancelled, alice):
    later = _continued_and_ended(cancelled, alice, JobState.SUCCEEDED, HTTP_IDEMPOTENCY_KEY="k1")

    again = api_client(alice).post(f"/api/v1/jobs/{cancelled.pk}/continue/", HTTP_IDEMPOTENCY_KEY="k1")

    assert again.status_code == 200 and again.json()["id"] == str(later.pk)


def test_the_same_idempotency_key_returns_the_same_continuation(cancelled, alice):
    client = api_client(alice)
    first = client.post(f"/api/v1/jobs/{cancelled.pk}/continue/", HTTP_IDEMPOTENCY_KEY="k1")
    again = client.post(f"/api/v1/jobs/{cancelled.pk}/continue/", HTTP_IDEMPOTENCY_KEY="k1")

    assert (first.status_code, again.status_code) == (201, 200) and first.json()["id"] == again.json()["id"]
    assert Checkpoint.objects.filter(job_id=first.json()["id"]).count() == 2


def test_the_active_job_cap_applies_as_for_a_submit(cancelled, alice, settings):
    settings.MAX_ACTIVE_JOBS_PER_USER = 1
    api_client(alice).post("/api/v1/jobs/", SEED_SPEC, content_type="application/yaml")

    response = api_client(alice).post(f"/api/v1/jobs/{cancelled.pk}/continue/")

    assert response.status_code == 429 and response.json()["limit"] == 1


def test_the_copy_outlives_the_old_jobs_checkpoint_retention_and_deletion(cancelled, alice, settings):
    new_id = api_client(alice).post(f"/api/v1/jobs/{cancelled.pk}/continue/").json()["id"]
    settings.CHECKPOINT_RETENTION_DAYS = 1
    Job.objects.filter(pk=cancelled.pk).update(finished_at=timezone.now() - timedelta(days=2))

    assert checkpoints_housekeeping()["jobs"] == 1
    Job.objects.filter(pk=cancelled.pk).delete()

    assert not Checkpoint.objects.filter(job_id=cancelled.pk).exists()
    for row in Checkpoint.objects.filter(job_id=new_id):
        assert hashlib.sha256(artifact_path(row.key).read_bytes()).hexdigest() == row.sha256


def test_the_job_page_offers_continue_from_epoch_n_and_the_new_page_names_its_origin(cancelled, alice, client):
    client.force_login(alice)
    page = client.get(f"/jobs/{cancelled.pk}/").content.decode()
    assert 'id="continue-button"' in page and "Continue from epoch 3" in page

    response = client.post(f"/jobs/{cancelled.pk}/continue/", {"timeout_hours": "1.5", "idempotency_key": "p1"})

    new = Job.objects.exclude(pk=cancelled.pk).get()
    assert response.status_code == 302 and response["Location"] == f"/jobs/{new.pk}/"
    assert new.timeout_s == 5400 and new.spec["continued_from"]["epoch"] == 3
    page = client.get(f"/jobs/{new.pk}/").content.decode()
    assert 'id="continued-from"' in page and f'href="/jobs/{cancelled.pk}/"' in page
    assert 'id="continue-button"' not in page  # queued: nothing to continue yet
    Checkpoint.objects.filter(job=cancelled).delete()  # (its checkpoints gone after CHECKPOINT_RETENTION_DAYS)
    assert 'id="continue-button"' not in client.get(f"/jobs/{cancelled.pk}/").content.decode()


def test_the_old_jobs_page_links_its_continuation_and_offers_no_second_continue(cancelled, alice, client):
    """Trial25 F3: the old page said nothing of its continuation, and offered Continue while it ran."""
    client.force_login(alice)
    later = Job.objects.get(pk=api_client(alice).post(f"/api/v1/jobs/{cancelled.pk}/continue/").json()["id"])

    page = client.get(f"/jobs/{cancelled.pk}/").content.decode()
    assert 'id="continue-button"' not in page  # its click would be a duplicate of the queued continuation
    assert (f'id="continued-by">Continued by <a href="/jobs/{later.pk}/">{cancelled.task_name}</a> '
            f"({str(later.pk)[:8]}, queued, 3 epochs done).</div>") in page  # the 3 it carries over

    Job.objects.filter(pk=later.pk).update(state=JobState.CANCELLED, finished_at=timezone.now(), epochs_done=4)
    page = client.get(f"/jobs/{cancelled.pk}/").content.decode()
    assert 'id="continue-button"' not in page
    assert f"({str(later.pk)[:8]}, cancelled, 4 epochs done): to train on, continue that one.</div>" in page
    assert 'id="continued-by"' not in client.get(f"/jobs/{later.pk}/").content.decode()


def test_the_pages_timeout_is_in_hours_as_on_the_submit_form(cancelled, alice, client):
    """A trial typed 2 into a box that meant seconds (beside a submit form that asks for hours):
    the continuation was killed after 2 s, before its first epoch."""
    client.force_login(alice)
    page = client.get(f"/jobs/{cancelled.pk}/").content.decode()
    assert "Timeout (hours)" in page and 'name="timeout_hours"' in page and 'value="1"' in page  # 3600 s

    response = client.post(f"/jobs/{cancelled.pk}/continue/", {"timeout_hours": "2", "idempotency_key": "h1"})

    new = Job.objects.exclude(pk=cancelled.pk).get()
    assert response.status_code == 302 and new.timeout_s == 7200


@pytest.mark.parametrize(("hours", "expected"), [("0", "must be a number of hours above 0, got '0'"),
                                                 ("soon", "must be a number of hours above 0, got 'soon'"),
                                                 ("200", "the limit is 7200 s (2 hours)"),
                                                 ("1e308", "the limit is 7200 s (2 hours)"),
                                                 ("0.001", "is 4 s; a training's timeout is at least 60 s")])  # inf s: a 500 (sec19, F8)
def test_a_bad_timeout_on_the_page_is_refused_naming_it_in_hours(cancelled, alice, client, settings, hours, expected):
    settings.MAX_JOB_TIMEOUT_S = 7200
    client.force_login(alice)

    response = client.post(f"/jobs/{cancelled.pk}/continue/", {"timeout_hours": hours, "idempotency_key": "h2"},
                           follow=True)

    page = html.unescape(response.content.decode())
    assert "Could not continue: Timeout (hours):" in page and expected in page, page[:3000]
    assert not Job.objects.exclude(pk=cancelled.pk).exists()


@pytest.fixture
def out_of_memory(submit):
    """A job of 5 epochs that ran out of its 4Gi after epoch 3."""
    job = submit()
    checkpoint(job, 3, best=True)
    assert attempt_finish(job, outcome="failed", exit_code=-9, error="out of memory: used 4.0 GiB of its 4 GiB "
                                                                       "limit — ask for more memory") == "failed"
    return Job.objects.get(pk=job.pk)


def test_a_continuation_with_a_new_timeout_keeps_its_spec_as_yaml_for_edit_and_resubmit(cancelled, alice, client):
    """The changed spec was stored as JSON, so Edit & resubmit filled the YAML box with braces and quotes."""
    response = api_client(alice).post(f"/api/v1/jobs/{cancelled.pk}/continue/", {"timeout": 7200}, format="json")
    client.force_login(alice)

    page = html.unescape(client.get(f"/jobs/new/?from={response.json()['id']}").content.decode())

    assert "\ntimeout: 7200\n" in page and "task_name: " in page and '"timeout"' not in page


def test_a_job_that_ran_out_of_memory_is_continued_with_more(out_of_memory, alice):
    """A trial continued an out-of-memory job into the same out-of-memory: Continue took only a timeout."""
    response = api_client(alice).post(f"/api/v1/jobs/{out_of_memory.pk}/continue/", {"memory": "8Gi"}, format="json")

    assert response.status_code == 201, response.content
    new = Job.objects.get(pk=response.json()["id"])
    assert new.memory_mb == 8192 and out_of_memory.memory_mb == 4096
    assert new.spec["continued_from"]["epoch"] == 3 and new.timeout_s == out_of_memory.timeout_s


def test_a_bad_memory_is_refused_naming_memory(out_of_memory, alice):
    response = api_client(alice).post(f"/api/v1/jobs/{out_of_memory.pk}/continue/", {"memory": "lots"}, format="json")

    assert response.status_code == 400 and "must be a quantity like 16Gi" in response.json()["memory"][0]
    assert not Job.objects.exclude(pk=out_of_memory.pk).exists()


@pytest.mark.parametrize("memory", ["", "  "])
def test_an_empty_memory_gets_the_words_a_spec_s_memory_gets(out_of_memory, alice, memory):
    """``yoloq continue ID --memory ""`` got DRF's "This field may not be blank." (trial28); a spec's
    ``resources.memory: ""`` says what a quantity looks like."""
    client = api_client(alice)
    submitted = client.post("/api/v1/jobs/", SPEC.replace("memory: 4Gi", f'memory: "{memory}"'),
                            content_type="application/yaml")
    assert submitted.status_code == 400, submitted.content

    response = client.post(f"/api/v1/jobs/{out_of_memory.pk}/continue/", {"memory": memory}, format="json")

    assert response.status_code == 400, response.content
    assert response.json() == {"memory": submitted.json()["resources.memory"]}
    assert response.json()["memory"] == [f"must be a quantity like 16Gi or 512Mi, got {memory!r}"]
    assert not Job.objects.exclude(pk=out_of_memory.pk).exists()


def test_the_page_continues_with_the_memory_typed_in_its_box(out_of_memory, alice, client):
    client.force_login(alice)
    page = client.get(f"/jobs/{out_of_memory.pk}/").content.decode()
    assert 'name="memory" value="4Gi"' in page  # the spec's own, as written

    response = client.post(f"/jobs/{out_of_memory.pk}/continue/", {"timeout_hours": "1", "memory": "6Gi",
                                                                   "idempotency_key": "m1"})

    new = Job.objects.exclude(pk=out_of_memory.pk).get()
    assert response.status_code == 302 and new.memory_mb == 6144
    response = client.post(f"/jobs/{out_of_memory.pk}/continue/", {"memory": "lots", "idempotency_key": "m2"},
                           follow=True)
    assert "Could not continue: Memory: must be a quantity like 16Gi" in html.unescape(response.content.decode())


def test_a_refused_continue_keeps_what_was_typed_in_its_boxes(out_of_memory, alice, client):
    """Trial 20: after "Could not continue: Memory: …", the boxes held the job's own 4Gi and timeout
    again, what had been typed gone."""
    client.force_login(alice)

    response = client.post(f"/jobs/{out_of_memory.pk}/continue/", {"timeout_hours": "0.25", "memory": "lots",
                                                                   "idempotency_key": "m3"}, follow=True)

    page = html.unescape(response.content.decode())
    assert "Could not continue: Memory: must be a quantity like 16Gi" in page
    assert 'name="memory" value="lots"' in page and 'name="timeout_hours" min="0" step="any" value="0.25"' in page
    assert not Job.objects.exclude(pk=out_of_memory.pk).exists()


def test_with_an_object_store_the_copy_is_made_in_the_bucket(submit, alice, moto):
    import boto3
    from django.test import override_settings

    from apps.core.storage import artifact_save_bytes, cache_path
    from tests.s3 import s3_storages

    job = submit()
    assert attempt_finish(job, outcome="timed_out", exit_code=-15) == "timed_out"
    data = b"epoch 2, as the node's uploader stored it"
    with override_settings(STORAGES=s3_storages(moto)):
        key = f"jobs/{job.pk}/checkpoints/epoch-0002-attempt-1.pt"
        artifact_save_bytes(key, data)
        Checkpoint.objects.create(job=job, attempt=1, epoch=2, path="/srv/elsewhere/epoch-0002.pt", best=True,
                                  sha256=hashlib.sha256(data).hexdigest(), size=len(data), key=key)

        response = api_client(alice).post(f"/api/v1/jobs/{job.pk}/continue/")

    assert response.status_code == 201, response.content
    row = Checkpoint.objects.get(job_id=response.json()["id"])
    assert row.key == f"jobs/{row.job_id}/checkpoints/epoch-0002.pt" and row.best and not artifact_path(row.key).exists()
    s3 = boto3.client("s3", endpoint_url=moto["url"], aws_access_key_id="testing", aws_secret_access_key="testing",
                      region_name="us-east-1")
    assert s3.get_object(Bucket=moto["bucket"], Key=row.key)["Body"].read() == data
    assert not cache_path(row.sha256, "epoch-0002-attempt-1.pt").exists()  # not kept in the web's cache


def test_a_checkpoint_whose_bytes_changed_is_refused_and_no_job_is_made(cancelled, alice):
    newest = Checkpoint.objects.get(job=cancelled, epoch=3)
    artifact_path(newest.key).write_bytes(b"not what was recorded")

    response = api_client(alice).post(f"/api/v1/jobs/{cancelled.pk}/continue/")

    assert response.status_code == 409
    assert response.json()["checkpoint"][0].startswith("the stored checkpoint of epoch 3 cannot be used")
    assert Job.objects.count() == 1 and Checkpoint.objects.exclude(job=cancelled).count() == 0


def test_the_new_jobs_metrics_begin_with_the_old_jobs_epochs_up_to_its_checkpoint(submit, alice, node):
    old = submit()
    for epoch in (1, 2, 3, 4):  # epoch 4's point came, its checkpoint did not: 4 is trained again
        metrics_record(old, epoch=epoch, values={"train/box_loss": 2.0 - epoch / 10})
        if epoch < 4:
            checkpoint(old, epoch)
    assert attempt_finish(old, outcome="cancelled", exit_code=-15) == "cancelled"
    client = api_client(alice)

    new = Job.objects.get(pk=client.post(f"/api/v1/jobs/{old.pk}/continue/").json()["id"])
    assert job_claim(new, node=node, gpu_indices=[0], gpu_share=1.0, run_class="medium")
    new = attempt_start(job_id=new.pk, attempt_id=new.attempt_id, node_name="node-a")
    metrics_record(new, epoch=4, values={"train/box_loss": 0.6})
    # Its remaining time is measured on the epochs it trained itself: 100 s for epoch 4, one left.
    Job.objects.filter(pk=new.pk).update(started_at=MetricPoint.objects.get(job=new, epoch=4).created_at
                                         - timedelta(seconds=100))
    assert job_estimates([], [Job.objects.get(pk=new.pk)], timezone.now()).remaining_s[str(new.pk)] == 100
    metrics_record(new, epoch=5, values={"train/box_loss": 0.5})

    page = client.get(f"/api/v1/jobs/{new.pk}/metrics/").json()
    rows = page["results"]
    assert [(r["epoch"], r["attempt"]) for r in rows] == [(1, 0), (2, 0), (3, 0), (4, 1), (5, 1)]  # 0: inherited
    assert [r["values"]["train/box_loss"] for r in rows] == [1.9, 1.8, 1.7, 0.6, 0.5]
    assert [r["seq"] for r in rows] == sorted({r["seq"] for r in rows}) and rows[-1]["seq"] == page["seq"]
    after = client.get(f"/api/v1/jobs/{new.pk}/metrics/?after={rows[2]['seq']}").json()["results"]
    assert [r["epoch"] for r in after] == [4, 5]
    inherited = {p.epoch: p.created_at for p in MetricPoint.objects.filter(job=old)}
    assert all(p.created_at == inherited[p.epoch] for p in MetricPoint.objects.filter(job=new, attempt=0))
    assert MetricPoint.objects.filter(job=old).count() == 4  # the old job keeps its own


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_the_new_jobs_socket_history_has_the_inherited_epochs_after_its_submitted_event(cancelled, alice):
    from asgiref.sync import async_to_sync
    from channels.routing import URLRouter
    from channels.testing import WebsocketCommunicator

    from apps.portal.routing import websocket_urlpatterns

    for epoch in (1, 2, 3):
        metrics_record(cancelled, epoch=epoch, values={"train/box_loss": 2.0 - epoch / 10})
    new_id = api_client(alice).post(f"/api/v1/jobs/{cancelled.pk}/continue/").json()["id"]

    async def history() -> list[dict]:
        socket = WebsocketCommunicator(URLRouter(websocket_urlpatterns), f"/ws/jobs/{new_id}/")
        socket.scope["user"] = alice
        assert (await socket.connect())[0]
        messages = []
        while not (messages and messages[-1].get("history_end")):
            messages.append(await socket.receive_json_from(timeout=5))
        await socket.disconnect()
        return messages[:-1]

    messages = async_to_sync(history)()
    assert [(m["type"], m["seq"]) for m in messages] == [("status", 1), ("metrics", 2), ("metrics", 3), ("metrics", 4)]
    assert [m["data"]["epoch"] for m in messages[1:]] == [1, 2, 3]


STRUCTURED = SPEC.replace('command: "yolo train data=demo model=yolov8n.yaml epochs=5 imgsz=128"',
                          "train: {data: demo, model: yolov8n.yaml, epochs: 5, imgsz: 128}")


@pytest.mark.parametrize("spec", [SPEC, STRUCTURED], ids=["command", "structured"])
def test_it_trains_on_the_dataset_version_the_old_job_did_not_a_newer_one(submit, alice, teams, spec):
    from apps.datasets.demo import generate_demo_dataset
    from apps.datasets.selectors import team_dataset_root
    from apps.datasets.services import dataset_register

    cancelled = submit(spec=spec)
    checkpoint(cancelled, 2)
    attempt_finish(cancelled, outcome="cancelled", exit_code=-15)
    trained_on = cancelled.spec["inputs"]["data"]
    newer = dataset_register(team=teams["vision"], name="demo", yaml_path=generate_demo_dataset(
        team_dataset_root(teams["vision"]) / "demo-2", train=2, val=1, imgsz=64, seed=1))
    assert (trained_on["version"], newer.version) == (1, 2)

    response = api_client(alice).post(f"/api/v1/jobs/{cancelled.pk}/continue/")

    assert response.status_code == 201, response.content
    new = Job.objects.get(pk=response.json()["id"])
    assert new.spec["inputs"]["data"] == trained_on
    assert new.spec["resolved"]["data_yaml"] == cancelled.spec["resolved"]["data_yaml"]
    assert new.spec["train_args"]["data"] == "demo:v1" and "demo:v1" in new.raw_spec  # the page shows the version


def test_a_deleted_dataset_version_is_refused_naming_data_even_with_a_newer_one(cancelled, alice, teams, client):
    from apps.datasets.demo import generate_demo_dataset
    from apps.datasets.models import Dataset
    from apps.datasets.selectors import team_dataset_root
    from apps.datasets.services import dataset_delete, dataset_register

    dataset_register(team=teams["vision"], name="demo", yaml_path=generate_demo_dataset(
        team_dataset_root(teams["vision"]) / "demo-2", train=2, val=1, imgsz=64, seed=1))
    dataset_delete(dataset=Dataset.objects.get(team=teams["vision"], name="demo", version=1), by=alice)

    response = api_client(alice).post(f"/api/v1/jobs/{cancelled.pk}/continue/")

    assert response.status_code == 409, response.content
    assert response.json() == {"data": [
        "the job trained on dataset demo v1, which has been deleted since: a continuation trains on the same data "
        "as the epochs it continues (to train on another version, use Edit & resubmit: a new training)"]}
    assert Job.objects.count() == 1 and not list(cancelled.run_dir.parent.glob("*/checkpoints/*.json"))
    # The page offers no Continue whose click is that refusal (trial25); it names the deleted input.
    client.force_login(alice)
    page = client.get(f"/jobs/{cancelled.pk}/").content.decode()
    assert 'id="continue-button"' not in page and "Resubmit" in page


@pytest.fixture
def from_registered_model(submit, alice, tmp_path):
    """A job started from model=base:latest (v1, uploaded), cancelled after epoch 2 of 5."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    from tests.registry.conftest import build_checkpoint

    def push(names: dict | None) -> None:
        folder = tmp_path / f"w{len(names or {})}"
        folder.mkdir()
        path = build_checkpoint("yolov8n.yaml", folder, names=names)
        upload = SimpleUploadedFile("base.pt", path.read_bytes(), content_type="application/octet-stream")
        response = api_client(alice).post("/api/v1/weights/", {"file": upload, "team": "vision"}, format="multipart")
        assert response.status_code == 201, response.content

    push(None)
    job = submit(spec=SPEC.replace("model=yolov8n.yaml", "model=base:latest"))
    assert job.spec["inputs"]["model"]["version"] == 1
    checkpoint(job, 2)
    attempt_finish(job, outcome="cancelled", exit_code=-15)
    return Job.objects.get(pk=job.pk), push


def test_it_starts_from_the_model_version_the_old_job_did_not_a_newer_one(from_registered_model, alice):
    """model=base:latest was re-resolved at continue time: the new job named v2 as the weights it
    came from, though its epochs came from v1's training (and a fallback start over would use v2)."""
    cancelled, push = from_registered_model
    push({0: "part"})  # base v2

    response = api_client(alice).post(f"/api/v1/jobs/{cancelled.pk}/continue/")

    assert response.status_code == 201, response.content
    new = Job.objects.get(pk=response.json()["id"])
    assert new.spec["inputs"]["model"] == cancelled.spec["inputs"]["model"]
    assert new.spec["resolved"]["model"] == cancelled.spec["resolved"]["model"]
    assert "model=base:v1" in new.raw_spec  # the page shows the version


def test_a_deleted_model_version_is_refused_naming_model_and_why_it_is_needed(from_registered_model, alice, client):
    """The resume loads the checkpoint, but the worker still fetches the model's weights and starts
    over from them if the checkpoint cannot be loaded; an uploaded version's file goes with its row."""
    from apps.registry.models import ModelVersion
    from apps.registry.services import model_version_delete

    cancelled, _ = from_registered_model
    model_version_delete(version=ModelVersion.objects.get(name="base", version=1), by=alice)

    response = api_client(alice).post(f"/api/v1/jobs/{cancelled.pk}/continue/")

    assert response.status_code == 409, response.content
    assert list(response.json()) == ["model"], response.json()
    assert response.json()["model"][0].startswith("the job started from model base v1, which has been deleted since")
    assert Job.objects.count() == 1 and not list(cancelled.run_dir.parent.glob("*/checkpoints/*.json"))
    client.force_login(alice)
    assert 'id="continue-button"' not in client.get(f"/jobs/{cancelled.pk}/").content.decode()


# --- the continuation stays in the job's team (sec19, F1) -------------------------------------------

NO_TEAM_SPEC = SPEC.replace("user: vision\n", "")


@pytest.fixture
def vision_job(bob, demo_registered, node, clean_storage):
    """bob's (vision only) job whose spec names no team, so vision's; cancelled after epoch 2."""

    def make(spec: str = NO_TEAM_SPEC) -> Job:
        response = api_client(bob).post("/api/v1/jobs/", spec, content_type="application/yaml")
        assert response.status_code == 201, response.content
        job = Job.objects.get(pk=response.json()["id"])
        assert job.team.slug == "vision"
        assert job_claim(job, node=node, gpu_indices=[0], gpu_share=1.0, run_class="medium")
        job = attempt_start(job_id=job.pk, attempt_id=job.attempt_id, node_name="node-a")
        checkpoint(job, 1)
        checkpoint(job, 2)
        assert attempt_finish(job, outcome="cancelled", exit_code=-15) == "cancelled"
        return Job.objects.get(pk=job.pk)

    return make


def test_a_member_of_two_teams_continues_a_job_in_its_own_team_not_their_first(vision_job, teams, carol):
    """A spec without ``user:`` is charged to the submitter's team (their only one then); continuing it must not charge the
    continuing person's first team (robotics, by slug) instead, carrying vision's checkpoint and curves there."""
    from apps.accounts.services import membership_set
    from tests.conftest import make_user

    job = vision_job()
    dana = make_user("dana", teams["vision"])
    membership_set(user=dana, team=teams["robotics"], role="member")

    response = api_client(dana).post(f"/api/v1/jobs/{job.pk}/continue/")

    assert response.status_code == 201, response.content
    assert response.json()["team"] == "vision"
    # robotics' own people (carol is in robotics only) never see vision's continuation.
    assert api_client(carol).get(f"/api/v1/jobs/{response.json()['id']}/").status_code == 404


def test_a_teammate_continues_a_job_whose_spec_names_its_submitter(vision_job, alice):
    """``user: bob`` (the submitter's own name) is bob's team: his teammate continuing it gets the job in
    that team, not a 400 saying she is not a member of a team named 'bob'."""
    job = vision_job(SPEC.replace("user: vision", "user: bob"))

    response = api_client(alice).post(f"/api/v1/jobs/{job.pk}/continue/")

    assert response.status_code == 201, response.content
    assert response.json()["team"] == "vision" and response.json()["user"] == "alice"


def test_continuing_again_while_the_continuation_is_active_names_it(cancelled, alice):
    """Without an Idempotency-Key a second continue is a duplicate of the active continuation: the 409
    names that job (its name, short id and state), as the submit's duplicate 409 does (review26)."""
    client = api_client(alice)
    first = client.post(f"/api/v1/jobs/{cancelled.pk}/continue/")
    assert first.status_code == 201

    again = client.post(f"/api/v1/jobs/{cancelled.pk}/continue/")

    assert again.status_code == 409
    body = again.json()
    assert body["job"]["id"] == first.json()["id"]
    assert f"({first.json()['id'][:8]}, queued)" in body["detail"] and "already active" in body["detail"]


def test_a_replay_copies_no_checkpoint(cancelled, alice):
    """A retry under the key answers with the job it made without copying the checkpoints again only to
    delete them: a checkpoint's bytes twice per retry, and a copy that failed (here: the old job's file
    gone from the store) made the replay a 409 "the stored checkpoint … cannot be used"."""
    client = api_client(alice)
    first = client.post(f"/api/v1/jobs/{cancelled.pk}/continue/", HTTP_IDEMPOTENCY_KEY="k1")
    for stored in Checkpoint.objects.filter(job=cancelled):
        artifact_path(stored.key).unlink()

    again = client.post(f"/api/v1/jobs/{cancelled.pk}/continue/", HTTP_IDEMPOTENCY_KEY="k1")

    assert (first.status_code, again.status_code) == (201, 200), again.content
    assert again.json()["id"] == first.json()["id"]


def test_a_job_over_a_newly_lowered_per_job_gpu_limit_is_continued_with_fewer_gpus(cancelled, alice, settings):
    """trial31: after the team's per-job limit dropped to 0.5, a 1-GPU job could not be continued at all
    (Edit & resubmit starts over); ``gpu`` is the new job's resources.gpu, checked as a submit's."""
    from apps.quotas.models import TeamQuota

    settings.ADMISSION_CACHE_S = 0
    TeamQuota.objects.update_or_create(team=cancelled.team, defaults={"max_gpus_per_job": 0.5})
    client = api_client(alice)

    refused = client.post(f"/api/v1/jobs/{cancelled.pk}/continue/")
    assert refused.status_code == 400, refused.content
    assert refused.json()["resources.gpu"] == [
        "asks for 1 GPUs; the per-job limit is 0.5 (continue with fewer: gpu, yoloq continue --gpus N)"]
    over = client.post(f"/api/v1/jobs/{cancelled.pk}/continue/", {"gpu": 2}, format="json")
    assert over.status_code == 400 and over.json() == {"gpu": ["asks for 2 GPUs; the per-job limit is 0.5"]}

    response = client.post(f"/api/v1/jobs/{cancelled.pk}/continue/", {"gpu": 0.5}, format="json")

    assert response.status_code == 201, response.content
    new = Job.objects.get(pk=response.json()["id"])
    assert new.gpus == 0.5 and cancelled.gpus == 1 and new.spec["continued_from"]["epoch"] == 3
    assert "gpu: 0.5" in new.raw_spec and "memory: 4Gi" in new.raw_spec


@pytest.mark.parametrize("gpu", [0, 0.3, "two", True])
def test_a_bad_gpu_is_refused_naming_gpu_as_a_spec_s_is(cancelled, alice, gpu):
    response = api_client(alice).post(f"/api/v1/jobs/{cancelled.pk}/continue/", {"gpu": gpu}, format="json")

    assert response.status_code == 400, response.content
    assert set(response.json()) == {"gpu"}
    assert "must be a whole number of GPUs from 1 to 64, or 0.125, 0.25 or 0.5 of one GPU" in response.json()["gpu"][0]
    assert not Job.objects.exclude(pk=cancelled.pk).exists()


def test_a_gpus_field_is_told_the_field_continue_takes(alice, teams):
    """{"gpus": 1} was told "ask with resources.gpu", a spec's field continue/ has not: its own is gpu (trial 32)."""
    from tests.jobs.factories import make_job

    job = make_job(team=teams["vision"], user=alice, state=JobState.FAILED)
    response = api_client(alice).post(f"/api/v1/jobs/{job.pk}/continue/", {"gpus": 1}, format="json")
    assert response.status_code == 400
    assert response.json() == {"gpus": ["cannot be set: are allocated by the scheduler (ask with gpu, e.g. "
                                        "{\"gpu\": 1})"]}


def _val_unlabelled(job: Job) -> None:
    """The dataset ``job`` trained on as an upload without val labels records it (stats: val images, 0
    instances): a training submitted before such trainings were refused (fix31b) is continued now."""
    from apps.datasets.models import Dataset

    dataset = Dataset.objects.get(pk=job.spec["inputs"]["data"]["id"])
    splits = dataset.stats["splits"]
    dataset.stats = {**dataset.stats, "splits": {**splits, "val": {**splits["val"], "labels": 0, "instances": 0}}}
    dataset.save(update_fields=["stats"])


def test_a_training_on_an_unlabelled_val_split_is_continued_with_val_false(cancelled, alice):
    """fix31b refused such a training unless val=false, which continue could not set: the job could
    only start over (Edit & resubmit). ``val`` is the new job's val argument (Ultralytics lets a
    resume change it); without it the refusal says how to continue."""
    _val_unlabelled(cancelled)
    client = api_client(alice)

    refused = client.post(f"/api/v1/jobs/{cancelled.pk}/continue/")
    assert refused.status_code == 400, refused.content
    assert refused.json()["command.data"][0].endswith(
        "or train with val=false (no validation during training; the last epoch's is still 0) (continue with "
        "val=false: val in the API, yoloq continue --no-val, or untick Validate on the job page)")
    bad = client.post(f"/api/v1/jobs/{cancelled.pk}/continue/", {"val": "maybe"}, format="json")
    assert bad.status_code == 400 and bad.json() == {"val": ["Must be a valid boolean."]}

    response = client.post(f"/api/v1/jobs/{cancelled.pk}/continue/", {"val": False}, format="json")

    assert response.status_code == 201, response.content
    new = Job.objects.get(pk=response.json()["id"])
    assert new.spec["train_args"]["val"] is False and "val=False" in new.raw_spec
    assert new.spec["continued_from"]["epoch"] == 3 and new.spec["train_args"]["epochs"] == 5


def test_the_continue_form_takes_gpus_and_validate_as_the_api_does(cancelled, alice, client):
    """fix31b: the API and ``yoloq continue --gpus`` took ``gpu``; the page had no box for it (nor for val)."""
    client.force_login(alice)
    page = client.get(f"/jobs/{cancelled.pk}/").content.decode()
    assert 'name="gpu" value="1"' in page and 'name="val" value="true" checked' in page

    response = client.post(f"/jobs/{cancelled.pk}/continue/", {"gpu": "two", "val_shown": "1", "val": "true",
                                                              "idempotency_key": "g1"}, follow=True)
    assert not Job.objects.exclude(pk=cancelled.pk).exists()
    text = html.unescape(response.content.decode())
    assert ("Could not continue: GPUs: must be a whole number of GPUs from 1 to 64, or 0.125, 0.25 or 0.5 of one "
            "GPU") in text
    assert 'name="gpu" value="two"' in text  # the box holds what was typed

    _val_unlabelled(cancelled)
    response = client.post(f"/jobs/{cancelled.pk}/continue/", {"gpu": "0.5", "val_shown": "1",
                                                              "idempotency_key": "g2"})

    new = Job.objects.exclude(pk=cancelled.pk).get()
    assert response.status_code == 302 and response["Location"] == f"/jobs/{new.pk}/"
    assert new.gpus == 0.5 and new.spec["train_args"]["val"] is False
