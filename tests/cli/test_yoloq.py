"""yoloq against a live server: login, submit, queue, status, logs -f, cancel."""

from __future__ import annotations

import json
import stat
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.accounts.services import token_create
from apps.jobs.models import Job, JobState
from apps.jobs.services import job_transition, log_append
from cli import yoloq
from tests.conftest import SEED_SPEC
from tests.jobs.factories import make_job

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def logged_in(web, alice, config):
    _, key = token_create(user=alice, name="cli")
    assert yoloq.main(["login", web.url, "--token", key]) == 0
    return web


def run(capsys, *argv) -> tuple[int, str, str]:
    code = yoloq.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_login_keeps_the_url_and_token_readable_only_by_the_owner(logged_in, config):
    saved = json.loads(config.read_text())
    assert saved["url"] == logged_in.url and saved["token"].startswith("yp_")
    assert stat.S_IMODE(config.stat().st_mode) == 0o600


def test_login_takes_the_api_address_too(web, alice, config, capsys):
    """Trial 23: http://host/api/v1/ (the address curl lines use) became …/api/v1/api/v1/usage/, a 404."""
    _, key = token_create(user=alice, name="cli")

    code, out, err = run(capsys, "login", f"{web.url}/api/v1/", "--token", key)

    assert code == 0, err
    assert json.loads(config.read_text())["url"] == web.url and out.startswith(f"Logged in to {web.url} as alice")


def test_login_refuses_a_bad_token(web, alice, config, capsys):
    code, _, err = run(capsys, "login", web.url, "--token", "yp_nonsense")
    assert code == 1 and "refused the token" in err and not config.exists()


def test_submit_queue_status_and_cancel(logged_in, tmp_path, capsys):
    spec = tmp_path / "job.yaml"
    spec.write_text(SEED_SPEC)
    code, out, _ = run(capsys, "submit", str(spec))
    assert code == 0 and "Submitted job" in out
    job = Job.objects.get()
    # What a planning pass writes for a waiting job: a point ETA inside its P10-P90 range.
    now = timezone.now()
    Job.objects.filter(pk=job.pk).update(
        queue_position=1, reason="waiting for 1 GPU on one node", estimated_start_at=now + timedelta(hours=2, minutes=1),
        estimated_start_low_at=now + timedelta(hours=1, minutes=31), estimated_start_high_at=now + timedelta(hours=3, minutes=1))

    code, out, _ = run(capsys, "queue")
    assert code == 0 and str(job.pk)[:8] in out and "yolo-v8s-industrial-inspection" in out and "queued" in out
    assert "start in 2.0 h (likely in 1.5 h to 3.0 h)" in out

    code, out, _ = run(capsys, "status", str(job.pk)[:8])
    assert code == 0 and "state: queued" in out and "vision / alice" in out
    assert "in 2.0 h (likely in 1.5 h to 3.0 h)" in out

    code, out, _ = run(capsys, "cancel", str(job.pk)[:8])
    assert code == 0 and "Cancelled" in out
    assert Job.objects.get().state == JobState.CANCELLED


def test_status_gives_the_priority_score_of_a_queued_job_only(logged_in, alice, teams, capsys):
    """The score orders the queue; once running it meant nothing (a requeued job's attempt 2 said 0: trial23)."""
    queued = make_job(team=teams["vision"], user=alice, priority_class="high", priority_score=23995.4)
    running = make_job(team=teams["vision"], user=alice, state=JobState.RUNNING, priority_class="high", attempt=2)

    code, out, _ = run(capsys, "status", str(queued.pk)[:8])
    assert code == 0 and "class: high (priority 23995)\n" in out
    code, out, _ = run(capsys, "status", str(running.pk)[:8])
    assert code == 0 and "priority" not in out and "high" in out


def test_status_says_an_urgent_job_runs_as_high_beyond_the_urgent_allowance(logged_in, alice, teams, capsys):
    """Trial 31: a demoted urgent job (run_class high: its team past the urgent allowance) read "class: urgent"
    in `yoloq status` and on its page, while the scheduler ran, charged and preempted it as high."""
    demoted = make_job(team=teams["vision"], user=alice, state=JobState.RUNNING, priority_class="urgent",
                       run_class="high")
    kept = make_job(team=teams["vision"], user=alice, state=JobState.RUNNING, priority_class="urgent",
                    run_class="urgent")

    code, out, _ = run(capsys, "status", str(demoted.pk)[:8])
    assert code == 0 and "class: urgent (runs as high: beyond the team's urgent allowance)\n" in out, out
    code, out, _ = run(capsys, "status", str(kept.pk)[:8])
    assert code == 0 and "class: urgent\n" in out, out


def test_submit_again_under_the_same_idempotency_key_gives_the_same_job(logged_in, tmp_path, capsys):
    """A retried CI step: its second submit was a 409 "identical job already active", exit 1 (CI trial 17, H2)."""
    spec = tmp_path / "job.yaml"
    spec.write_text(SEED_SPEC)
    first = run(capsys, "submit", "-q", "--idempotency-key", "pipeline-41-train", str(spec))
    again = run(capsys, "submit", "-q", "--idempotency-key", "pipeline-41-train", str(spec))
    job = Job.objects.get()
    assert first == again == (0, f"{job.pk}\n", "")


def test_an_idempotency_key_used_for_another_spec_is_refused_naming_it(logged_in, tmp_path, capsys):
    spec = tmp_path / "job.yaml"
    spec.write_text(SEED_SPEC)
    assert run(capsys, "submit", "--idempotency-key", "k1", str(spec))[0] == 0
    spec.write_text(SEED_SPEC.replace("epochs=2", "epochs=3"))
    code, _, err = run(capsys, "submit", "--idempotency-key", "k1", str(spec))
    assert code == 1 and "Idempotency-Key: was already used for another request" in err
    assert Job.objects.count() == 1


def test_submit_prints_the_field_errors_of_a_bad_spec(logged_in, tmp_path, capsys):
    spec = tmp_path / "bad.yaml"
    spec.write_text(SEED_SPEC.replace("epochs=2", "epochs=ten"))
    code, _, err = run(capsys, "submit", str(spec))
    assert code == 1 and "command.epochs: must be an integer, got 'ten'" in err


def test_logs_follow_prints_everything_and_stops_when_the_job_ends(logged_in, alice, capsys):
    from tests.portal.helpers import submit

    job = submit(alice)
    log_append(job, "epoch 1/2\n")
    log_append(job, "epoch 2/2\n")
    job_transition(job.pk, expected=[JobState.QUEUED], to=JobState.SUCCEEDED)
    code, out, err = run(capsys, "logs", "-f", str(job.pk))
    assert code == 0 and out == "epoch 1/2\nepoch 2/2\n" and "job succeeded" in err


def test_logs_follow_exits_non_zero_when_the_job_did_not_succeed(logged_in, alice, capsys):
    """A CI step following a job must fail with it: `logs -f` exited 0 for a failed job (CI trial 17, H1)."""
    from tests.portal.helpers import submit

    job = submit(alice)
    log_append(job, "out of memory\n")
    job_transition(job.pk, expected=[JobState.QUEUED], to=JobState.FAILED)
    code, out, err = run(capsys, "logs", "-f", str(job.pk))
    assert code == 3 and out == "out of memory\n" and "job failed" in err


@pytest.mark.parametrize(("ended", "code"), [(JobState.SUCCEEDED, 0), (JobState.FAILED, 3),
                                             (JobState.TIMED_OUT, 4), (JobState.CANCELLED, 5)])
def test_wait_exits_with_how_the_job_ended(logged_in, alice, capsys, ended, code):
    from tests.portal.helpers import submit

    job = submit(alice)
    job_transition(job.pk, expected=[JobState.QUEUED], to=ended, error="exceeded its timeout of 8 s\nmore")
    exit_code, out, _ = run(capsys, "wait", str(job.pk)[:8])
    assert exit_code == code and f"{job.pk} ({job.task_name}): {ended}" in out


def test_wait_gives_up_at_its_timeout_while_the_job_waits(logged_in, alice, capsys):
    from tests.portal.helpers import submit

    job = submit(alice)
    code, _, err = run(capsys, "wait", str(job.pk), "--timeout", "0.3", "--interval", "0.1")
    assert code == 124 and "is still queued after 0.3 s" in err


def test_an_unknown_job_is_reported_plainly(logged_in, capsys):
    code, _, err = run(capsys, "status", "deadbeef")
    assert code == 1 and "no job of yours" in err


def test_a_prefix_finds_a_job_older_than_the_newest_thousand(logged_in, alice, teams, capsys):
    """The prefix was looked for among the newest 1,000 jobs only: "no job of yours" for an older one."""
    old = make_job(team=teams["vision"], user=alice, state=JobState.SUCCEEDED)
    Job.objects.bulk_create(Job(task_name="n", team=teams["vision"], user=alice, spec={}, spec_hash=str(i),
                                timeout_s=60, state=JobState.SUCCEEDED) for i in range(1001))
    code, out, err = run(capsys, "status", str(old.pk)[:8])
    assert code == 0 and str(old.pk) in out, err
    code, _, err = run(capsys, "status", "zzzz")
    assert code == 1 and "id: must be the start of a job id: 4 to 36 hex digits (0-9, a-f) and dashes, got 'zzzz'" in err


def test_queue_shows_a_running_sweep_as_a_sweep_not_on_a_node(logged_in, tmp_path, capsys):
    """A sweep's parent holds no GPU (its trials do): it was listed "on None"."""
    from tests.sweeps.test_sweep_step import SWEEP_YAML

    spec = tmp_path / "sweep.yaml"
    spec.write_text(SWEEP_YAML)
    assert run(capsys, "submit", str(spec))[0] == 0
    Job.objects.filter(task_name="lr-sweep").update(state=JobState.RUNNING, started_at=timezone.now())
    code, out, _ = run(capsys, "queue")
    assert code == 0 and "sweep: its trials run as jobs of their own" in out and "None" not in out


def test_every_positional_argument_has_help(capsys):
    """`yoloq requeue -h` listed its id with no word on it (manager trial 15, F10)."""
    import argparse

    def positionals(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from positionals(sub, (*path, name))
            elif not action.option_strings:
                yield " ".join((*path, action.dest)), action.help

    assert [where for where, text in positionals(yoloq.parser()) if not text] == []
    with pytest.raises(SystemExit):
        yoloq.main(["requeue", "-h"])
    assert "unique prefix" in capsys.readouterr().out


def test_a_closed_stdout_pipe_ends_quietly(logged_in, alice, teams, config):
    """`yoloq queue --state succeeded | head -3`: the reader is gone before yoloq prints (trial 16, G15)."""
    import os
    import subprocess
    import sys

    for n in range(3):
        make_job(team=teams["vision"], user=alice, state=JobState.SUCCEEDED, task_name=f"done-{n}")
    read, write = os.pipe()
    os.close(read)  # the reader has gone away before yoloq writes anything
    try:
        done = subprocess.run([sys.executable, "-m", "cli.yoloq", "queue", "--state", "succeeded"], stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=60, env={**os.environ})
    finally:
        os.close(write)
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr
    assert done.returncode == 141


COLOURED = ["\x1b[34m\x1b[1mtrain: \x1b[0mScanning labels... 4 images\n", "      1/2  \x1b[K0.5G  1.2", "3  \x1b[",
            "32mok\x1b[0m\n"]


def test_logs_to_a_file_or_pipe_drop_colour_and_cursor_codes(logged_in, alice, capsys):
    """`yoloq logs JOB > file` kept Ultralytics' colour and erase-line codes; a code split between two
    log chunks goes too."""
    from tests.portal.helpers import submit

    job = submit(alice)
    for text in COLOURED:
        log_append(job, text)
    code, out, _ = run(capsys, "logs", str(job.pk))
    assert code == 0 and out == "train: Scanning labels... 4 images\n      1/2  0.5G  1.23  ok\n"


def test_logs_to_a_terminal_keep_the_codes_unless_no_color_is_set(logged_in, alice, capsys, monkeypatch):
    import sys

    from tests.portal.helpers import submit

    job = submit(alice)
    for text in COLOURED:
        log_append(job, text)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    monkeypatch.setenv("NO_COLOR", "")  # set but empty: no-color.org says colour stays
    assert run(capsys, "logs", str(job.pk)) == (0, "".join(COLOURED), "")
    monkeypatch.setenv("NO_COLOR", "1")
    code, out, _ = run(capsys, "logs", str(job.pk))
    assert code == 0 and out == "train: Scanning labels... 4 images\n      1/2  0.5G  1.23  ok\n"


def test_logs_of_a_job_whose_logs_retention_deleted_say_so(monkeypatch, capsys):
    """The API's note (LOG_RETENTION_DAYS deleted an ended job's logs) goes to stderr; before,
    `yoloq logs` printed nothing at all (optrial24)."""
    note = "no log: logs are deleted 30 days after a job ends (LOG_RETENTION_DAYS), and this job ended 2026-01-01 10:00 UTC"

    class Api:
        def get(self, path, **params):
            return {"job": "j", "state": "succeeded", "seq": 9, "results": [], "note": note}

    monkeypatch.setattr(yoloq, "api_from_config", Api)
    monkeypatch.setattr(yoloq, "job_resolve", lambda api, prefix: "0b1c2d3e-0000-0000-0000-000000000000")
    code, out, err = run(capsys, "logs", "0b1c")
    assert code == 0 and out == "" and f"yoloq: {note}" in err
