"""The browser pages through Django's test client: scoping, the submit form's errors, actions."""

from __future__ import annotations

import re
import uuid

import pytest
from django.test import Client

from apps.accounts.models import ApiToken
from apps.jobs.models import Job, JobState
from apps.jobs.services import job_transition, metrics_record
from tests.conftest import api_client

from .helpers import submit

pytestmark = pytest.mark.django_db


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


FORM = {"mode": "form", "f-task_name": "pcb", "f-team": "vision", "f-dataset": "demo", "f-model": "yolov8n.yaml",
        "f-epochs": "3", "f-imgsz": "128", "f-batch": "8", "f-gpus": "1", "f-priority": "medium",
        "f-timeout_hours": "2"}


def field_errors(html: str) -> dict[str, str]:
    return dict(re.findall(r'<p class="field-error" data-field="(\w+)">([^<]*)</p>', html))


# --- sign in and out --------------------------------------------------------------------------


def test_pages_send_anonymous_visitors_to_sign_in(client):
    for path in ("/", "/jobs/", "/jobs/new/", "/usage/", "/models/", "/tokens/"):
        response = client.get(path)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/"), path


def test_it_signs_in_with_a_password_and_out_with_a_post(alice):
    client = Client()
    response = client.post("/accounts/login/", {"username": "alice", "password": "pw-alice"})
    assert response.status_code == 302 and response["Location"] == "/"
    assert "Sign out?" in client.get("/accounts/logout/").content.decode()
    assert client.post("/accounts/logout/").status_code == 302
    assert client.get("/").status_code == 302


# --- dashboard ----------------------------------------------------------------------------------


def test_the_dashboard_shows_gpus_with_the_simulated_badge_and_my_jobs(alice, node, demo_registered):
    submit(alice, task_name="mine-queued")
    html = signed_in(alice).get("/").content.decode()
    assert "node-a" in html and "simulated" in html and "16384 MiB" in html
    assert "mine-queued" in html
    assert 'data-class="medium"><b>1</b>' in html


def test_the_dashboard_hides_what_another_team_runs(alice, carol, node, demo_registered):
    job = submit(carol, task_name="robotics-secret", team="robotics")
    job_transition(job.pk, expected=[JobState.QUEUED], to=JobState.RUNNING, node=node, gpu_indices=[0])
    html = signed_in(alice).get("/dashboard/live/").content.decode()
    assert "robotics-secret" not in html and "busy (another team)" in html


def test_a_superusers_dashboard_calls_the_team_jobs_what_they_are(superuser, alice, carol, node, demo_registered):
    """A superuser who manages no team read "My teams' jobs (… of the teams you manage)" above every
    team's jobs (manager trial 15, F27); a manager still reads their teams'."""
    submit(carol, task_name="robotics-q", team="robotics")
    html = signed_in(superuser).get("/").content.decode()
    assert "All teams' jobs" in html and "robotics-q" in html
    assert "My teams' jobs" not in html and "of the teams you manage" not in html
    manager_html = signed_in(alice).get("/dashboard/live/").content.decode()
    assert "My teams' jobs" in manager_html and "All teams' jobs" not in manager_html


# --- submit ---------------------------------------------------------------------------------------


def test_the_form_shows_a_bad_value_next_to_its_field(alice, demo_registered):
    response = signed_in(alice).post("/jobs/new/", {**FORM, "f-epochs": "ten"})
    assert response.status_code == 200
    assert field_errors(response.content.decode()) == {"epochs": "must be an integer, got &#x27;ten&#x27;"}
    assert not Job.objects.exists()


def test_a_timeout_of_no_hours_is_an_error_at_its_field_not_a_one_second_job(alice, demo_registered):
    """A zero or negative timeout was rounded up to 1 s: the job started and was killed at once."""
    client = signed_in(alice)
    for hours, message in (("-1", "must be more than 0 hours, got -1"), ("0", "must be more than 0 hours, got 0"),
                           ("inf", "must be a number of hours, got &#x27;inf&#x27;"),
                           ("soon", "must be a number of hours, got &#x27;soon&#x27;")):
        response = client.post("/jobs/new/", {**FORM, "f-timeout_hours": hours})
        assert response.status_code == 200, hours
        assert field_errors(response.content.decode()) == {"timeout_hours": message}, hours
    assert not Job.objects.exists()
    assert client.post("/jobs/new/", {**FORM, "f-timeout_hours": "0.5"}).status_code == 302
    assert Job.objects.get().timeout_s == 1800


def test_a_timeout_of_a_few_seconds_in_hours_is_an_error_at_its_field(alice, demo_registered):
    """0.0001 hours was rounded to a 1-second training, which timed out at once (trial23)."""
    response = signed_in(alice).post("/jobs/new/", {**FORM, "f-timeout_hours": "0.0001"})
    assert response.status_code == 200
    assert field_errors(response.content.decode()) == {"timeout_hours": (
        "is 1 s; a training&#x27;s timeout is at least 60 s (1 min, MIN_TRAIN_TIMEOUT_S): its process starts and "
        "loads the model first, so a shorter one ends it before it trains")}
    assert not Job.objects.exists()


@pytest.mark.parametrize("mode", ["form", "sweep"])
def test_a_timeout_of_more_hours_than_a_float_holds_in_seconds_is_an_error_at_its_field(mode, alice, demo_registered,
                                                                                       settings):
    """1e308 hours is finite, its seconds are not: round(inf) was an OverflowError, a 500 (sec19, F8)."""
    limit = settings.MAX_JOB_TIMEOUT_S
    prefix = mode[0]
    form = {"mode": mode, **{f"{prefix}-{k[2:]}": v for k, v in FORM.items() if k != "mode"},
            f"{prefix}-timeout_hours": "1e308"}
    if mode == "sweep":
        form |= {"s-method": "grid", "s-parallel": "1", "s-metric": "fitness", "s-optimizer": "SGD",
                 "s-p0_name": "lr0", "s-p0_choices": "0.01,0.02"}

    response = signed_in(alice).post("/jobs/new/", form)

    assert response.status_code == 200
    assert field_errors(response.content.decode())["timeout_hours"] == (
        f"is 1e308 hours; the limit is {limit} s ({limit / 3600:g} hours)")
    assert not Job.objects.exists()


def test_the_form_puts_database_errors_at_their_field_too(alice, demo_registered):
    response = signed_in(alice).post("/jobs/new/", {**FORM, "f-dataset": "nope", "f-model": "nope.yaml"})
    errors = field_errors(response.content.decode())
    assert "unknown dataset" in errors["dataset"] and "unknown model YAML" in errors["model"]


def test_the_form_shows_every_problem_in_one_answer(alice, demo_registered):
    """Trial 16, G9: six problems took three submits (the timeout first, then the spec's fields,
    then the dataset and the model, each round hiding the next)."""
    response = signed_in(alice).post("/jobs/new/", {**FORM, "f-task_name": "", "f-dataset": "nonexist",
                                                    "f-model": "nope.pt", "f-epochs": "ten", "f-imgsz": "-5",
                                                    "f-timeout_hours": "abc"})
    errors = field_errors(response.content.decode())
    assert set(errors) == {"task_name", "dataset", "model", "epochs", "imgsz", "timeout_hours"}, errors
    assert "unknown dataset" in errors["dataset"] and "nope.pt" in errors["model"]
    # A form whose only problem is its timeout still says what the database would refuse.
    response = signed_in(alice).post("/jobs/new/", {**FORM, "f-dataset": "nonexist", "f-timeout_hours": "abc"})
    assert set(field_errors(response.content.decode())) == {"dataset", "timeout_hours"}
    assert not Job.objects.exists()


def test_the_task_names_limit_is_the_specs_on_the_form_too(alice, demo_registered):
    """Trial25 F4: the box took 300 characters, 301 said "at most 300", 250 then "at most 200"."""
    page = signed_in(alice).get("/jobs/new/").content.decode()
    assert re.search(r'name="f-task_name"[^>]*maxlength="200"', page)
    assert re.search(r'name="s-task_name"[^>]*maxlength="200"', page)
    for length in (201, 250, 301):
        response = signed_in(alice).post("/jobs/new/", {**FORM, "f-task_name": "x" * length})
        assert "at most 200" in field_errors(response.content.decode())["task_name"], length
    assert not Job.objects.exists()
    response = signed_in(alice).post("/jobs/new/", {**FORM, "f-task_name": "x" * 200})
    assert response.status_code == 302 and Job.objects.get().task_name == "x" * 200


def test_the_dataset_box_offers_each_name_once(alice, demo_registered):
    """Trial25: a name with two versions was offered twice (the list's ordering broke DISTINCT)."""
    from tests.datasets.archives import make_zip, upload, valid_files

    for extra in ({}, {"labels/val/0.txt": b"1 0.5 0.5 0.1 0.1\n"}):
        response = api_client(alice).post("/api/v1/datasets/", {"file": upload(make_zip(valid_files() | extra)),
                                                                "name": "rects", "team": "vision"},
                                          format="multipart")
        assert response.status_code == 201, response.content
    page = signed_in(alice).get("/jobs/new/").content.decode()
    options = re.findall(r'<option value="([^"]+)">', re.search(r'<datalist id="datasets">(.*?)</datalist>',
                                                                 page).group(1))
    assert options == sorted(set(options)) and options.count("rects") == 1 and "demo" in options


def test_the_form_submits_and_goes_to_the_job_page(alice, demo_registered):
    response = signed_in(alice).post("/jobs/new/", FORM)
    job = Job.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/jobs/{job.pk}/"
    assert job.spec["train_args"] == {"data": "demo", "model": "yolov8n.yaml", "epochs": 3, "imgsz": 128, "batch": 8}
    assert job.timeout_s == 7200 and job.team.slug == "vision"


def test_a_double_submit_with_the_same_form_key_makes_one_job(alice, demo_registered):
    client = signed_in(alice)
    client.post("/jobs/new/", {**FORM, "idempotency_key": "k1"})
    client.post("/jobs/new/", {**FORM, "idempotency_key": "k1"})
    assert Job.objects.count() == 1


def test_a_duplicate_of_an_active_job_is_explained(alice, demo_registered):
    client = signed_in(alice)
    client.post("/jobs/new/", FORM)
    html = client.post("/jobs/new/", FORM).content.decode()
    assert "An identical job of your team is already active" in html
    assert client.post("/jobs/new/", {**FORM, "f-allow_duplicate": "on"}).status_code == 302
    assert Job.objects.count() == 2


def test_the_yaml_box_lists_every_problem_by_path(alice, demo_registered):
    spec = 'task_name: x\ncommand: "yolo train data=demo model=yolov8n.yaml epochs=ten"\npriority: asap\n'
    html = signed_in(alice).post("/jobs/new/", {"mode": "yaml", "y-spec_text": spec}).content.decode()
    assert re.search(r'data-path="command.epochs"><code>command.epochs</code> must be an integer', html)
    assert 'data-path="priority"' in html


def test_the_yaml_box_refuses_a_key_given_twice(alice, demo_registered):
    spec = 'task_name: a\ntask_name: b\ncommand: "yolo train data=demo model=yolov8n.yaml epochs=1 imgsz=64"\n'
    html = signed_in(alice).post("/jobs/new/", {"mode": "yaml", "y-spec_text": spec}).content.decode()
    assert re.search(r'data-path="task_name"><code>task_name</code> given twice in the YAML', html)
    assert not Job.objects.exists()


def test_an_uploaded_yaml_file_is_submitted(alice, demo_registered):
    from django.core.files.uploadedfile import SimpleUploadedFile

    from tests.conftest import SEED_SPEC

    upload = SimpleUploadedFile("job.yaml", SEED_SPEC.encode(), content_type="application/yaml")
    response = signed_in(alice).post("/jobs/new/", {"mode": "yaml", "y-spec_text": "", "y-spec_file": upload})
    assert response.status_code == 302
    assert Job.objects.get().raw_spec == SEED_SPEC


def test_an_uploaded_utf16_yaml_file_is_submitted_and_a_latin1_one_is_told_its_encoding(alice, demo_registered):
    """A spec saved by Windows Notepad as "Unicode" (UTF-16 with its byte-order mark) was refused
    "is not UTF-8 text" (trial30)."""
    import codecs

    from django.core.files.uploadedfile import SimpleUploadedFile

    from tests.conftest import SEED_SPEC

    upload = SimpleUploadedFile("job.yaml", codecs.BOM_UTF16_LE + SEED_SPEC.encode("utf-16-le"))
    response = signed_in(alice).post("/jobs/new/", {"mode": "yaml", "y-spec_text": "", "y-spec_file": upload})
    assert response.status_code == 302
    assert Job.objects.get().raw_spec == SEED_SPEC
    upload = SimpleUploadedFile("job.yaml", SEED_SPEC.replace("yolo", "y\xf6lo").encode() + b"# caf\xe9\n")
    page = signed_in(alice).post("/jobs/new/", {"mode": "yaml", "y-spec_text": "", "y-spec_file": upload})
    assert "is not UTF-8 text (byte " in page.content.decode() and "save it as UTF-8" in page.content.decode()


def test_a_refused_uploaded_file_is_what_the_yaml_box_shows_and_says_so(alice, demo_registered):
    """Trial25 F5: a pasted spec and a file both given: the problems were the file's, the box showed the paste."""
    import html as html_lib

    from django.core.files.uploadedfile import SimpleUploadedFile

    from tests.conftest import SEED_SPEC

    bad = 'task_name: "from the file"\ncommand: "yolo train data=demo model=yolov8n.yaml epochs=ten"\n'
    upload = SimpleUploadedFile("job.yaml", bad.encode(), content_type="application/yaml")
    page = signed_in(alice).post("/jobs/new/", {"mode": "yaml", "y-spec_text": SEED_SPEC,
                                                "y-spec_file": upload}).content.decode()
    assert re.search(r'data-path="command.epochs"><code>command.epochs</code> must be an integer', page)
    box = html_lib.unescape(re.search(r'(?s)<textarea name="y-spec_text"[^>]*>(.*?)</textarea>', page).group(1))
    assert box.strip() == bad.strip()
    assert 'id="spec-file-used">The spec below is the text of the uploaded file job.yaml' in page
    assert not Job.objects.exists()
    # Without a file the box keeps what was typed, and says nothing of a file.
    page = signed_in(alice).post("/jobs/new/", {"mode": "yaml", "y-spec_text": bad}).content.decode()
    assert "spec-file-used" not in page


def test_edit_and_resubmit_prefills_the_yaml_box(alice, demo_registered):
    job = submit(alice, task_name="again")
    html = signed_in(alice).get(f"/jobs/new/?from={job.pk}").content.decode()
    assert "task_name: again" in html


def test_a_form_job_keeps_its_numbers_as_numbers_for_edit_and_resubmit(alice, demo_registered):
    """The spec the form stores, shown on the job page and in the YAML box, reads "epochs": 3, not "3"."""
    import json

    client = signed_in(alice)
    client.post("/jobs/new/", {**FORM, "f-epochs": "30", "f-gpus": "0.5"})
    job = Job.objects.get()
    stored = json.loads(job.raw_spec)
    assert stored["train"] == {"data": "demo", "model": "yolov8n.yaml", "epochs": 30, "imgsz": 128, "batch": 8}
    assert stored["resources"] == {"gpu": 0.5}
    html = client.get(f"/jobs/new/?from={job.pk}").content.decode()
    assert "&quot;epochs&quot;: 30," in html and "&quot;30&quot;" not in html


def test_a_sweep_form_job_keeps_its_numbers_as_numbers(alice, demo_registered):
    import yaml

    form = {f"s-{k.removeprefix('f-')}": v for k, v in FORM.items() if k.startswith("f-")}
    response = signed_in(alice).post("/jobs/new/", {
        **form, "mode": "sweep", "s-method": "tpe", "s-trials": "4", "s-parallel": "2", "s-optimizer": "SGD",
        "s-metric": "metrics/mAP50-95(B)", "s-p1_name": "lr0", "s-p1_low": "1e-4", "s-p1_high": "0.1",
        "s-p1_log": "on", "s-p2_name": "batch", "s-p2_choices": "8, 16", "s-p3_name": "optimizer",
        "s-p3_choices": "SGD, AdamW"})
    assert response.status_code == 302, response.content.decode()[:2000]
    stored = yaml.safe_load(Job.objects.get(parent=None).raw_spec)
    assert (stored["train"]["epochs"], stored["sweep"]["trials"], stored["sweep"]["parallel"]) == (3, 4, 2)
    assert stored["sweep"]["parameters"] == {"lr0": {"low": 0.0001, "high": 0.1, "log": True},
                                             "batch": [8, 16], "optimizer": ["SGD", "AdamW"]}


def test_a_sweep_row_with_both_choices_and_a_range_is_refused_at_that_row(alice, demo_registered):
    """trial26: a row with choices *and* low/high was submitted as the choices alone (the range
    silently dropped: a random sweep over one value, every trial alike); the API refuses both."""
    form = {f"s-{k.removeprefix('f-')}": v for k, v in FORM.items() if k.startswith("f-")}
    sweep = {**form, "mode": "sweep", "s-method": "random", "s-trials": "2", "s-parallel": "2",
             "s-optimizer": "SGD", "s-p1_name": "lr0"}
    client = signed_in(alice)
    response = client.post("/jobs/new/", {**sweep, "s-p1_low": "0.001", "s-p1_high": "0.1", "s-p1_choices": "0.01, 0.02"})
    assert response.status_code == 200 and not Job.objects.exists()
    assert field_errors(response.content.decode()) == {
        "p1_choices": "give choices or a range (low, high), not both"}
    # A step that is no number is named once, at its box, without a "parameters is required" beside it.
    response = client.post("/jobs/new/", {**sweep, "s-p1_low": "0.001", "s-p1_high": "0.1", "s-p1_step": "abc"})
    assert response.status_code == 200 and not Job.objects.exists()
    assert field_errors(response.content.decode()) == {"p1_step": "must be a number, got &#x27;abc&#x27;"}


def test_a_word_in_a_number_box_still_reaches_the_parser_as_typed(alice, demo_registered):
    errors = field_errors(signed_in(alice).post("/jobs/new/", {**FORM, "f-epochs": "nan"}).content.decode())
    assert "nan" in errors["epochs"]


# --- jobs list and job page ---------------------------------------------------------------------


def test_a_waiting_jobs_priority_is_whole_points_with_a_tooltip_saying_what_it_is(alice, demo_registered):
    """Not a bare "23985.333" (new-user trial): the score, rounded, and what it is made of."""
    job = submit(alice, task_name="waiting")
    Job.objects.filter(pk=job.pk).update(priority_score=23985.333, priority_factors={
        "fairshare": 0.667, "age": 0.004, "size": 0.93, "class": 0.333})
    html = signed_in(alice).get(f"/jobs/{job.pk}/").content.decode()
    assert '<span data-field="priority">23,985</span>' in html and "23985.3" not in html
    title = re.search(r'id="priority" data-help="[^"]*" title="([^"]*)"', html).group(1)
    assert "highest first" in title
    assert title.endswith("This job: fair-share 0.67 · age 0.00 · size 0.93 · class 0.33.")


@pytest.mark.parametrize("path", ["/jobs/", "/dashboard/live/"])
def test_an_estimated_start_that_has_passed_reads_any_moment(path, alice, demo_registered):
    """Not "in 0 minutes (up to 0 minutes)" (new-user trial: an ETA range whose low end had passed)."""
    from datetime import timedelta

    from django.utils import timezone

    now = timezone.now()
    waiting = submit(alice, task_name="waiting")
    Job.objects.filter(pk=waiting.pk).update(estimated_start_at=now - timedelta(seconds=3),
                                             estimated_start_low_at=now - timedelta(seconds=10),
                                             estimated_start_high_at=now + timedelta(minutes=10, seconds=30))
    overdue = submit(alice, task_name="overdue")
    Job.objects.filter(pk=overdue.pk).update(estimated_start_at=now - timedelta(minutes=5),
                                             estimated_start_low_at=now - timedelta(minutes=9),
                                             estimated_start_high_at=now - timedelta(minutes=1))
    html = signed_in(alice).get(path).content.decode()
    text = re.sub(r"<[^>]+>", "", html)
    assert text.count("any moment") == 2
    assert "(up to 10\xa0minutes)" in text and text.count("(up to") == 1
    assert not re.search(r"(in|up to) 0\xa0minutes", text) and not re.search(r"^\s*0\xa0minutes\s*$", text, re.M)


def priority_options(html: str, prefix: str = "f") -> list[str]:
    select = re.search(rf'<select name="{prefix}-priority".*?</select>', html, re.S).group(0)
    return re.findall(r'<option value="(\w+)"', select)


def test_the_submit_form_offers_urgent_only_to_who_may_submit_it(alice, bob, carol, teams, demo_registered):
    """A member of a team that keeps urgent for its managers was offered urgent, then refused (manager trial 15, F4)."""
    from apps.accounts.models import Membership, Team

    Team.objects.filter(slug="vision").update(urgent_by=Team.UrgentBy.MANAGERS)
    page = signed_in(bob).get("/jobs/new/").content.decode()
    assert priority_options(page) == priority_options(page, "s") == ["low", "medium", "high"]
    assert "your teams let only their managers submit urgent jobs" in page
    assert "urgent" in priority_options(signed_in(alice).get("/jobs/new/").content.decode())
    Membership.objects.create(user=carol, team=teams["vision"], role="member")  # robotics lets every member
    page = signed_in(carol).get("/jobs/new/").content.decode()
    assert "urgent" in priority_options(page)
    assert "urgent: for jobs of robotics only (vision lets only its managers submit urgent jobs)" in page
    forged = signed_in(bob).post("/jobs/new/", {**FORM, "f-priority": "urgent"}).content.decode()
    assert "team vision lets only its managers submit urgent jobs" in forged  # the submit still refuses it
    assert not Job.objects.exists()


def test_the_jobs_list_filters_mine_team_and_state(alice, bob, carol, demo_registered):
    submit(alice, task_name="alices")
    bobs = submit(bob, task_name="bobs")
    submit(carol, task_name="carols", team="robotics")
    job_transition(bobs.pk, expected=[JobState.QUEUED], to=JobState.CANCELLED)
    client = signed_in(alice)
    mine = client.get("/jobs/?scope=mine").content.decode()
    assert "alices" in mine and "bobs" not in mine
    team = client.get("/jobs/?scope=team").content.decode()
    assert "alices" in team and "bobs" in team and "carols" not in team
    cancelled = client.get("/jobs/?scope=team&state=cancelled").content.decode()
    assert "bobs" in cancelled and "alices" not in cancelled
    finished = client.get("/jobs/?scope=team&state=finished").content.decode()
    assert "bobs" in finished and "alices" not in finished
    active = client.get("/jobs/?scope=team&state=active").content.decode()
    assert "alices" in active and "bobs" not in active
    unknown = client.get("/jobs/?scope=team&state=bogus").content.decode()
    assert "alices" in unknown and "bobs" in unknown
    # A team that is none of hers filters nothing either, and the page does not name it (trial25 F6:
    # "Every job of robotics … 0 jobs").
    for other in ("robotics", "%F0%9F%9A%80"):
        page = client.get(f"/jobs/?scope=team&team={other}").content.decode()
        assert "alices" in page and "bobs" in page and "carols" not in page, other
        assert "Every job of your teams" in page and "Every job of robotics" not in page
    assert "Every job of vision" in client.get("/jobs/?scope=team&team=vision").content.decode()


def test_the_jobs_list_shows_position_estimate_and_reason(alice, demo_registered):
    from datetime import timedelta

    from django.utils import timezone

    job = submit(alice, task_name="waiting")
    Job.objects.filter(pk=job.pk).update(queue_position=3, reason="waiting for 1 GPU on node-a",
                                         estimated_start_at=timezone.now() + timedelta(hours=2))
    html = signed_in(alice).get("/jobs/").content.decode()
    assert "<td>3</td>" in html and "waiting for 1 GPU on node-a" in html and "in 1\xa0hour" in html


def test_the_job_page_is_404_for_another_team(alice, carol, demo_registered):
    job = submit(alice)
    assert signed_in(carol).get(f"/jobs/{job.pk}/").status_code == 404
    assert signed_in(carol).post(f"/jobs/{job.pk}/cancel/").status_code == 404


def test_the_job_page_shows_the_socket_and_a_cancel_button_to_the_owner(alice, bob, demo_registered):
    job = submit(alice)
    html = signed_in(alice).get(f"/jobs/{job.pk}/").content.decode()
    assert f"/ws/jobs/{job.pk}/" in html and 'id="cancel-button"' in html and 'id="loss-chart"' in html
    assert 'id="cancel-button"' not in signed_in(bob).get(f"/jobs/{job.pk}/").content.decode()


def test_an_ended_job_without_epochs_does_not_promise_curves(alice, demo_registered):
    """Trial 23: a job cancelled in the queue said "curves appear after the first epoch"."""
    job = submit(alice)
    assert "curves appear after the first epoch" in signed_in(alice).get(f"/jobs/{job.pk}/").content.decode()
    job_transition(job.pk, expected=[JobState.QUEUED], to=JobState.CANCELLED)

    html = signed_in(alice).get(f"/jobs/{job.pk}/").content.decode()

    assert "curves appear after the first epoch" not in html and "no epoch finished, so there are no curves" in html


def test_a_teammate_who_is_not_a_manager_cannot_cancel(alice, bob, demo_registered):
    job = submit(bob)
    signed_in(bob).get("/")
    job_of_alice = submit(alice, task_name="alices")
    signed_in(bob).post(f"/jobs/{job_of_alice.pk}/cancel/")
    assert Job.objects.get(pk=job_of_alice.pk).state == JobState.QUEUED
    # alice manages vision: she may cancel bob's job
    signed_in(alice).post(f"/jobs/{job.pk}/cancel/")
    assert Job.objects.get(pk=job.pk).state == JobState.CANCELLED


def test_resubmit_makes_a_new_job_from_the_same_spec(alice, demo_registered):
    job = submit(alice, task_name="first")
    job_transition(job.pk, expected=[JobState.QUEUED], to=JobState.FAILED)
    response = signed_in(alice).post(f"/jobs/{job.pk}/resubmit/")
    new = Job.objects.exclude(pk=job.pk).get()
    assert response["Location"] == f"/jobs/{new.pk}/" and new.raw_spec == job.raw_spec



def test_resubmit_keeps_the_job_in_its_team_for_a_member_of_two(bob, carol, teams, demo_registered):
    """bob's spec names no team (so vision, his only one); dana, in robotics and vision, resubmits it:
    the copy is vision's again, not dana's first team's (robotics by slug), where carol would read it (sec19, F1)."""
    from apps.accounts.services import membership_set
    from apps.core.strict_yaml import load_yaml
    from apps.jobs.services import job_submit
    from apps.jobs.spec import parse_spec
    from tests.conftest import SEED_SPEC, make_user

    text = SEED_SPEC.replace("user: vision\n", "")
    job, _ = job_submit(user=bob, spec=parse_spec(load_yaml(text, max_bytes=1 << 16)), raw_spec=text)
    assert job.team.slug == "vision"
    job_transition(job.pk, expected=[JobState.QUEUED], to=JobState.FAILED)
    dana = make_user("dana", teams["vision"])
    membership_set(user=dana, team=teams["robotics"], role="member")

    response = signed_in(dana).post(f"/jobs/{job.pk}/resubmit/")

    new = Job.objects.exclude(pk=job.pk).get()
    assert response["Location"] == f"/jobs/{new.pk}/" and new.team.slug == "vision"
    assert signed_in(carol).get(f"/jobs/{new.pk}/").status_code == 404

def test_edit_and_resubmit_names_the_jobs_team_for_a_member_of_two(bob, teams, demo_registered):
    """Edit & resubmit showed bob's text naming no team; dana (robotics and vision) submitting it
    unchanged was charged to robotics. The box names the job's team, the rest of the text as it was."""
    from apps.accounts.services import membership_set
    from apps.core.strict_yaml import load_yaml
    from apps.jobs.services import job_submit
    from apps.jobs.spec import parse_spec
    from tests.conftest import SEED_SPEC, make_user

    text = "# nightly\n" + SEED_SPEC.replace("user: vision\n", "")
    job, _ = job_submit(user=bob, spec=parse_spec(load_yaml(text, max_bytes=1 << 16)), raw_spec=text)
    dana = make_user("dana", teams["vision"])
    membership_set(user=dana, team=teams["robotics"], role="member")
    page = signed_in(dana).get(f"/jobs/new/?from={job.pk}")
    shown = page.context["yaml_form"].initial["spec_text"]
    assert shown == "team: vision\n" + text
    job_transition(job.pk, expected=[JobState.QUEUED], to=JobState.FAILED)
    named = SEED_SPEC.replace("user: vision", "user: bob")  # the submitter's name: his first team
    job2, _ = job_submit(user=bob, spec=parse_spec(load_yaml(named, max_bytes=1 << 16)), raw_spec=named)
    shown = signed_in(dana).get(f"/jobs/new/?from={job2.pk}").context["yaml_form"].initial["spec_text"]
    assert shown == SEED_SPEC
    assert signed_in(bob).get(f"/jobs/new/?from={job2.pk}").context["yaml_form"].initial["spec_text"] == SEED_SPEC


# --- usage, models, tokens ------------------------------------------------------------------------


def test_the_usage_page_has_a_chart_of_gpu_hours_by_day(alice, demo_registered):
    from datetime import timedelta

    from django.utils import timezone

    from apps.quotas.models import UsageRecord

    job = submit(alice)
    now = timezone.now()
    midnight = now.astimezone(timezone.get_current_timezone()).replace(hour=0, minute=0, second=0, microsecond=0)
    end = now - min(timedelta(hours=1), (now - midnight) / 2)  # today, even in the small hours (charted by end)
    UsageRecord.objects.create(job=job, team=job.team, user=alice, attempt=1, priority_class="medium",
                               gpu_seconds=7200, started_at=end - timedelta(hours=2), ended_at=end)
    response = signed_in(alice).get("/usage/")
    chart = response.context["chart"]
    assert chart["me"][-1] == 2.0 and chart["teams"]["vision"][-1] == 2.0 and len(chart["labels"]) == 14
    assert 'id="usage-chart"' in response.content.decode()


def test_the_models_page_lists_team_models_with_metrics_and_download(alice, carol, demo_registered):
    from apps.registry.models import ModelVersion

    job = submit(alice)
    version = ModelVersion.objects.create(team=job.team, name="pcb", version=1, job=job, weights_key="jobs/x/best.pt",
                                          metrics={"metrics/mAP50(B)": 0.5, "metrics/mAP50-95(B)": 0.25})
    html = signed_in(alice).get("/models/").content.decode()
    assert "pcb</b>:v1" in html and "0.500" in html and "0.250" in html
    assert f"/api/v1/models/{version.pk}/download/" in html
    assert "pcb</b>" not in signed_in(carol).get("/models/").content.decode()


def test_a_new_token_is_shown_once_and_can_be_revoked(alice):
    client = signed_in(alice)
    html = client.post("/tokens/", {"name": "laptop", "ttl_days": "30"}).content.decode()
    key = re.search(r'<pre class="code" id="new-token">(yp_[^<]+)</pre>', html).group(1)
    token = ApiToken.objects.get(user=alice)
    assert token.name == "laptop" and token.expires_at is not None
    assert key not in client.get("/tokens/").content.decode()
    client.post(f"/tokens/{token.pk}/revoke/")
    token.refresh_from_db()
    assert token.revoked_at is not None


def test_nobody_revokes_someone_elses_token(alice, bob):
    from apps.accounts.services import token_create

    token, _ = token_create(user=bob, name="bobs")
    assert signed_in(alice).post(f"/tokens/{token.pk}/revoke/").status_code == 404


def test_a_bad_token_lifetime_is_shown_at_its_field(alice):
    response = signed_in(alice).post("/tokens/", {"name": "x", "ttl_days": "forever"})
    assert "must be a whole number of days" in response.content.decode()
    assert not ApiToken.objects.exists()


@pytest.mark.parametrize("days", ["forever", "0", "100000"])
def test_a_refused_token_form_comes_back_as_typed(alice, days):
    """Trial 20: the name was emptied and the days went back to the default after a refusal."""
    html = signed_in(alice).post("/tokens/", {"name": "ci runner", "ttl_days": days}).content.decode()
    assert 'maxlength="100" value="ci runner">' in html and f'value="{days}">' in html
    assert not ApiToken.objects.exists()


def test_the_live_metrics_reach_the_page_config(alice, demo_registered):
    job = submit(alice)
    metrics_record(job, epoch=1, values={"train/box_loss": 1.0})
    response = signed_in(alice).get(f"/jobs/{job.pk}/")
    assert response.context["page_config"]["api"] == f"/api/v1/jobs/{job.pk}/"


def test_opening_a_buttons_address_says_to_press_the_button(bob):
    """A GET on a POST-only portal address answered a blank 405 page (manager trial 15, F18)."""
    page = Client()
    page.force_login(bob)
    job_id = uuid.uuid4()
    for address, back in ((f"/jobs/{job_id}/requeue/", f'href="/jobs/{job_id}/"'),
                          (f"/jobs/{job_id}/class/", f'href="/jobs/{job_id}/"'),
                          ("/notifications/channels/1/test/", 'href="/notifications/"'),
                          ("/notifications/channels/1/enable/", 'href="/notifications/"')):
        response = page.get(address)
        assert response.status_code == 405 and response["Allow"] == "POST", address
        html = response.content.decode()
        assert "press the button" in html and back in html and "<nav" in html, address
    api = api_client(bob).get("/api/v1/notifications/channels/1/test/")
    assert api.status_code == 405 and "detail" in api.json()  # the API's JSON 405 stays


@pytest.mark.parametrize("path", ["/jobs/", "/dashboard/live/"])
def test_a_range_that_ends_as_its_point_reads_once(path, alice, demo_registered):
    """Trial 20: "in under a minute (up to under a minute)"."""
    from datetime import timedelta

    from django.utils import timezone

    now = timezone.now()
    job = submit(alice, task_name="soon")
    Job.objects.filter(pk=job.pk).update(estimated_start_at=now + timedelta(seconds=20),
                                         estimated_start_low_at=now + timedelta(seconds=10),
                                         estimated_start_high_at=now + timedelta(seconds=50))
    text = re.sub(r"<[^>]+>", "", signed_in(alice).get(path).content.decode())
    assert "in under a minute" in text and "(up to" not in text


def test_times_read_on_one_clock_with_their_zone_and_never_0_minutes(alice, demo_registered):
    """Trial 16, G14: "in 0 minutes (up to 1 minute)", "Submitted 0 minutes ago", and a job page's
    "Dec. 3, 2026, 9:43 p.m." beside its reason's "expected 21:43 UTC"."""
    from datetime import timedelta

    from django.utils import timezone

    now = timezone.now()
    job = submit(alice, task_name="soon")
    start = now + timedelta(seconds=40)
    Job.objects.filter(pk=job.pk).update(estimated_start_at=start, estimated_start_low_at=now + timedelta(seconds=20),
                                         estimated_start_high_at=now + timedelta(minutes=5, seconds=30))
    client = signed_in(alice)
    listing = re.sub(r"<[^>]+>", "", client.get("/jobs/").content.decode())
    assert "in under a minute" in listing and "(up to 5\xa0minutes)" in listing
    assert "just now" in listing
    assert not re.search(r"\b0\xa0minutes", listing)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert f"{start:%Y-%m-%d %H:%M} UTC" in page  # the estimated start, as the reasons write times
    assert not re.search(r"\d(a|p)\.m\.", page)


@pytest.mark.parametrize(("field", "text"), [("epochs", "3\u3000"), ("imgsz", "\u3000128"), ("batch", "8\u00a0"),
                                             ("timeout_hours", "2\u2003")])
def test_a_number_padded_with_a_unicode_space_is_refused_at_its_box_as_the_api_refuses_it(
        field, text, alice, demo_registered):
    """The API takes ASCII numbers only (apps.core.values.ascii_int): ``"3\\u3000"`` is refused there,
    while the form's boxes (Django's strip(), then typed()) took the ideographic space off and submitted 3."""
    response = signed_in(alice).post("/jobs/new/", {**FORM, f"f-{field}": text})
    assert response.status_code == 200 and not Job.objects.exists()
    errors = field_errors(response.content.decode())
    assert set(errors) == {field} and repr(text)[1:-1] in errors[field], errors


@pytest.mark.parametrize("field", ["trials", "p1_low", "p1_step"])
def test_a_sweep_number_padded_with_a_unicode_space_is_refused_at_its_box(field, alice, demo_registered):
    form = {f"s-{k.removeprefix('f-')}": v for k, v in FORM.items() if k.startswith("f-")}
    sweep = {**form, "mode": "sweep", "s-method": "random", "s-trials": "2", "s-parallel": "2",
             "s-optimizer": "SGD", "s-p1_name": "lr0", "s-p1_low": "0.001", "s-p1_high": "0.1"}
    response = signed_in(alice).post("/jobs/new/", {**sweep, f"s-{field}": sweep.get(f"s-{field}", "0.01") + "\u3000"})
    assert response.status_code == 200 and not Job.objects.exists()
    assert set(field_errors(response.content.decode())) == {field}


@pytest.mark.parametrize(("text", "value"), [(" 3 ", 3), (" 1e-4\t", 0.0001), (" Адам", "Адам"), ("Адам ", "Адам"),
                                             ("3\u3000", "3\u3000"), ("\u00a03", "\u00a03"), (" ten ", "ten")])
def test_a_box_s_text_loses_its_ascii_spaces_only(text, value):
    """typed() kept non-ASCII text whole (so "3\\u3000" reaches the parser and is refused), ASCII
    spaces included: "SGD, Адам" in a sweep's choices sent " Адам" (review29)."""
    from apps.portal.forms import typed

    assert typed(text) == value


def test_a_job_page_says_an_urgent_job_runs_as_high_beyond_the_urgent_allowance(alice, teams):
    """Trial 31: a demoted urgent job's page said only "urgent" (the scheduler placed and charges it as high)."""
    from tests.jobs.factories import make_job

    job = make_job(team=teams["vision"], user=alice, state=JobState.RUNNING, priority_class="urgent", run_class="high")
    html = signed_in(alice).get(f"/jobs/{job.pk}/").content.decode()
    assert "urgent</span><span class=\"muted\" id=\"run-class\"> · runs as high: beyond the team's urgent allowance" in html
    Job.objects.filter(pk=job.pk).update(run_class="urgent")
    html = signed_in(alice).get(f"/jobs/{job.pk}/").content.decode()
    assert "runs as" not in html
