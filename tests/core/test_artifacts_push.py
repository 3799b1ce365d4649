"""`manage.py artifacts_push` (docs/deploy.md, "Moving an existing installation into a bucket")."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.test import override_settings

from tests.jobs.factories import make_job
from tests.s3 import s3_storages

pytestmark = [pytest.mark.django_db, pytest.mark.integration]


def push(moto) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    with override_settings(STORAGES=s3_storages(moto)):
        call_command("artifacts_push", stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_a_push_while_jobs_run_says_their_later_files_will_not_be_in_the_bucket(alice, teams, moto, clean_storage):
    """Operator trial 29: pushed while a job trained, then restarted on the bucket as the docs
    said, the job resumed from the last checkpoint the push had copied (35 epochs lost); a job
    ending in between would have had its results on the old DATA_DIR only. Nothing said so."""
    running = make_job(team=teams["vision"], user=alice, state="running", task_name="still-training")
    make_job(team=teams["vision"], user=alice, state="succeeded", task_name="done")
    out, err = push(moto)
    assert "pushed" in out
    assert "1 job is starting or running" in err and str(running.pk)[:8] in err
    assert "run artifacts_push again" in err


def test_a_push_with_nothing_running_says_nothing_more(alice, teams, moto, clean_storage):
    make_job(team=teams["vision"], user=alice, state="succeeded", task_name="done")
    out, err = push(moto)
    assert "pushed" in out and err == ""
