"""Finding 8: server paths and tracebacks never reach a team member; names are team-relative."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test import Client

from apps.jobs.models import Job, JobEvent, JobState
from tests.conftest import SEED_SPEC, api_client

pytestmark = pytest.mark.django_db


def server_roots() -> list[str]:
    return [str(p) for p in (settings.DATA_DIR, settings.JOBS_DIR, settings.DATASETS_DIR, settings.WEIGHTS_DIR,
                             settings.BASE_DIR)]


def assert_no_server_paths(text: str) -> None:
    for root in server_roots():
        assert root not in text, f"{root} leaks in {text[:600]}"


@pytest.fixture
def submitted(bob, demo_registered):
    response = api_client(bob).post("/api/v1/jobs/", SEED_SPEC, content_type="application/yaml")
    assert response.status_code == 201, response.content
    return Job.objects.get(pk=response.json()["id"])


def test_the_job_api_shows_no_resolved_paths(bob, submitted):
    # The worker has artifact keys (never absolute paths); the team sees neither.
    assert submitted.spec["resolved"]["data_yaml"] == "datasets/_shared/demo/data.yaml"
    client = api_client(bob)
    for url in (f"/api/v1/jobs/{submitted.pk}/", "/api/v1/jobs/"):
        text = client.get(url).content.decode()
        assert "resolved" not in text
        assert_no_server_paths(text)


def test_the_job_page_shows_no_resolved_paths_even_without_the_raw_spec(bob, submitted):
    Job.objects.filter(pk=submitted.pk).update(raw_spec="")
    client = Client()
    client.force_login(bob)
    html = client.get(f"/jobs/{submitted.pk}/").content.decode()
    assert "resolved" not in html
    assert_no_server_paths(html)


def test_the_started_event_keeps_no_save_dir(bob, submitted, node):
    from worker.tasks import AttemptRunner, ChildResult

    Job.objects.filter(pk=submitted.pk).update(node=node, state=JobState.RUNNING)  # only a running attempt records
    submitted.refresh_from_db()
    runner = AttemptRunner(submitted)
    save_dir = str(submitted.run_dir / "train")
    runner.on_event({"type": "started", "epochs": 2, "start_epoch": 1, "save_dir": save_dir}, ChildResult())
    event = JobEvent.objects.get(job=submitted, kind="training_started")
    assert "save_dir" not in event.data
    text = api_client(bob).get(f"/api/v1/jobs/{submitted.pk}/events/").content.decode()
    assert_no_server_paths(text)


def test_logs_name_files_relative_to_the_job_and_the_team(bob, submitted):
    from apps.jobs.services import log_append

    run = submitted.run_dir
    dataset = settings.DATASETS_DIR / "vision" / "pcb"
    log_append(submitted, f"Results saved to {run}/train\ntrain: Scanning {dataset}/labels/train... 8 images\n"
                          f"Loading {settings.BASE_DIR}/.venv/lib/python3.11/site-packages/x.py\n")
    chunks = api_client(bob).get(f"/api/v1/jobs/{submitted.pk}/logs/").json()["results"]
    text = "".join(c["text"] for c in chunks)
    assert_no_server_paths(text)
    assert "Results saved to train\n" in text
    assert "Scanning pcb/labels/train..." in text
    assert "x.py" in text


@pytest.mark.django_db(transaction=True)  # the worker's finish() closes old connections
def test_an_error_keeps_the_message_but_no_traceback_or_absolute_path(bob, submitted, node):
    from worker.tasks import AttemptRunner, ChildResult

    Job.objects.filter(pk=submitted.pk).update(node=node, state="running")
    submitted.refresh_from_db()
    data_yaml = submitted.spec["resolved"]["data_yaml"]
    result = ChildResult(
        exit_code=1, outcome="failed",
        error={"kind": "data", "message": f"Dataset '{data_yaml}' images not found, missing path "
                                          f"'{settings.DATASETS_DIR}/_shared/demo/images/val'",
               "advice": "Check the dataset", "traceback": "Traceback (most recent call last): …"},
        log_tail=["Ultralytics 8.4 🚀 Python-3.11 torch CPU",
                  "Traceback (most recent call last):",
                  f'  File "{settings.BASE_DIR}/worker/train_child.py", line 700, in train',
                  "    model.train(**kwargs)",
                  '  File "/usr/lib/python3/dist-packages/ultralytics/engine/trainer.py", line 10, in f',
                  "    raise FileNotFoundError(x)",
                  f"FileNotFoundError: Dataset '{data_yaml}' images not found"],
    )
    AttemptRunner(submitted).finish(result)
    job = api_client(bob).get(f"/api/v1/jobs/{submitted.pk}/").json()
    assert job["state"] == "failed"
    assert "Traceback" not in job["error"] and 'File "' not in job["error"]
    assert "images not found" in job["error"] and "data.yaml" in job["error"]
    assert "FileNotFoundError" in job["error"]  # the exception's own line stays: it says what went wrong
    assert_no_server_paths(job["error"])
    assert "/usr/lib" not in job["error"]
    events = api_client(bob).get(f"/api/v1/jobs/{submitted.pk}/events/").content.decode()
    assert_no_server_paths(events)


def test_old_rows_are_cleaned_when_served(bob, submitted):
    """Errors stored before the fix are scrubbed on the way out too."""
    Job.objects.filter(pk=submitted.pk).update(
        error=f"training error: no such file {settings.JOBS_DIR}/{submitted.pk}/train/weights/last.pt")
    job = api_client(bob).get(f"/api/v1/jobs/{submitted.pk}/").json()
    assert_no_server_paths(job["error"])
    assert "train/weights/last.pt" in job["error"]


def test_urls_and_ratios_are_left_alone():
    from apps.jobs.paths import public_text

    text = "see https://docs.ultralytics.com/modes/train/ 1/10 epochs 3/4 ok, lr 0.01/2"
    assert public_text(text) == text


def test_what_a_person_typed_is_kept_and_only_that(bob, submitted):
    """An operator's words stay as typed; a server path beside them, or named "said" by a caller's data, does not."""
    from apps.jobs.services import job_event

    leak = f"{settings.JOBS_DIR}/{submitted.pk}/train/weights/last.pt"
    event = job_event(submitted, "note", f"see /wiki/maint-42, lost {leak}", {"said": [leak]},
                      said=["see /wiki/maint-42"])
    assert event.message == "see /wiki/maint-42, lost train/weights/last.pt"
    assert event.data == {"said": ["see /wiki/maint-42"]}
    smuggled = job_event(submitted, "note", f"lost {leak}", {"said": [leak]})
    assert smuggled.message == "lost train/weights/last.pt" and "said" not in smuggled.data
    served = api_client(bob).get(f"/api/v1/jobs/{submitted.pk}/events/").content.decode()
    assert "see /wiki/maint-42" in served
    assert_no_server_paths(served)


def test_paths_inside_terminal_colour_codes_are_cut_too(bob, submitted):
    from apps.jobs.paths import public_text

    text = f"Logging results to \x1b[1m{submitted.run_dir}/train\x1b[0m\n"
    assert public_text(text, job=submitted) == "Logging results to \x1b[1mtrain\x1b[0m\n"


def test_the_admin_pages_a_manager_opens_show_no_server_paths(manager, superuser, bob, teams):
    """Trial 14, F44: the Checkpoints admin showed a manager /srv/…/jobs/<id>/checkpoints/epoch-0167.pt."""
    from apps.jobs.models import Checkpoint, JobState, LogChunk
    from tests.conftest import admin_client
    from tests.jobs.factories import make_job

    job = make_job(team=teams["vision"], user=bob, state=JobState.FAILED)
    run_dir = settings.JOBS_DIR / str(job.pk)
    Job.objects.filter(pk=job.pk).update(error=f"CUDA error in {run_dir}/train/weights/last.pt")
    checkpoint = Checkpoint.objects.create(job=job, attempt=1, epoch=167, path=f"{run_dir}/checkpoints/epoch-0167.pt",
                                           sha256="0" * 64, size=1)
    event = JobEvent.objects.create(job=job, seq=1, attempt=1, kind="failed", message=f"see {run_dir}/train/out.log",
                                    data={"file": f"{run_dir}/train/out.log"})
    chunk = LogChunk.objects.create(job=job, seq=2, attempt=1, text=f"Saving {run_dir}/train/weights/best.pt\n")
    pages = [f"/admin/jobs/checkpoint/{checkpoint.pk}/change/", "/admin/jobs/checkpoint/",
             f"/admin/jobs/job/{job.pk}/change/", f"/admin/jobs/jobevent/{event.pk}/change/", "/admin/jobs/jobevent/",
             f"/admin/jobs/logchunk/{chunk.pk}/change/", "/admin/jobs/logchunk/"]
    seen = ""
    for url in pages:
        response = admin_client(manager).get(url)
        assert response.status_code == 200, url
        text = response.content.decode()
        assert_no_server_paths(text)
        seen += text
    for relative in ("checkpoints/epoch-0167.pt", "train/weights/last.pt", "train/out.log", "train/weights/best.pt"):
        assert relative in seen
    # the operator still sees where the file is
    text = admin_client(superuser).get(f"/admin/jobs/checkpoint/{checkpoint.pk}/change/").content.decode()
    assert f"{run_dir}/checkpoints/epoch-0167.pt" in text
