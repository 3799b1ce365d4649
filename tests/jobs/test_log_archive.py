"""Hot/cold logs (apps/jobs/log_archive.py): logs of jobs finished more than LOG_HOT_DAYS ago
move into the artifact storage and read back byte for byte; nothing is deleted unless
LOG_RETENTION_DAYS says so; an unreachable store leaves them in the database."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings as django_settings
from django.test import override_settings
from django.utils import timezone

from apps.core.artifacts import artifact_path
from apps.jobs.log_archive import logs_housekeeping
from apps.jobs.models import Job, JobState, LogChunk
from apps.jobs.services import log_append
from tests.conftest import api_client
from tests.jobs.factories import make_job
from tests.s3 import free_port

pytestmark = pytest.mark.django_db


def job_with_logs(team, user, *, state=JobState.SUCCEEDED, days_ago: float = 40, lines: int = 30) -> Job:
    job = make_job(team=team, user=user, state=JobState.RUNNING)
    for n in range(lines):
        log_append(job, f"Epoch {n}/{lines}: box_loss {1 / (n + 1):.4f} — ünïcode ✓\n" + "x" * (n % 7) + "\n")
    Job.objects.filter(pk=job.pk).update(state=state, finished_at=timezone.now() - timedelta(days=days_ago),
                                         first_started_at=timezone.now() - timedelta(days=days_ago + 1))
    return Job.objects.get(pk=job.pk)


def test_cold_logs_move_to_storage_and_read_back_byte_for_byte(alice, teams, settings, clean_storage):
    settings.LOG_HOT_DAYS = 30
    old = job_with_logs(teams["vision"], alice)
    recent = job_with_logs(teams["vision"], alice, days_ago=2)
    running = job_with_logs(teams["vision"], alice, state=JobState.RUNNING, days_ago=40)
    client = api_client(alice)
    before = {j.pk: client.get(f"/api/v1/jobs/{j.pk}/logs/").content for j in (old, recent, running)}
    page_before = client.get(f"/api/v1/jobs/{old.pk}/logs/?after=10").content

    done = logs_housekeeping()
    assert done["archived_jobs"] == 1 and done["archived_chunks"] == 30

    old.refresh_from_db()
    assert old.logs_key == f"jobs/{old.pk}/logs/chunks.jsonl.gz"
    assert artifact_path(old.logs_key).is_file()
    assert not LogChunk.objects.filter(job=old).exists()
    assert LogChunk.objects.filter(job=recent).count() == 30 and LogChunk.objects.filter(job=running).count() == 30
    after = {j.pk: client.get(f"/api/v1/jobs/{j.pk}/logs/").content for j in (old, recent, running)}
    assert after == before
    assert client.get(f"/api/v1/jobs/{old.pk}/logs/?after=10").content == page_before

    # The job page's socket replays the same text.
    from apps.portal.consumers import load_history

    _, messages = load_history.func(alice, old.pk)  # the function itself: no thread, no connection closing
    replayed = "".join(m["data"]["text"] for m in messages if m["type"] == "log")
    assert replayed == "".join(r["text"] for r in client.get(f"/api/v1/jobs/{old.pk}/logs/").json()["results"])
    assert replayed.count("Epoch") == 30

    # A second pass has nothing to do; nothing is deleted without a retention setting.
    assert logs_housekeeping()["archived_jobs"] == 0
    assert logs_housekeeping(now=timezone.now() + timedelta(days=3650))["deleted_archives"] == 0
    assert artifact_path(old.logs_key).is_file()


def test_retention_deletes_archives_only_when_set(alice, teams, settings, clean_storage):
    settings.LOG_HOT_DAYS = 30
    settings.LOG_RETENTION_DAYS = 365
    job = job_with_logs(teams["vision"], alice, days_ago=400)
    logs_housekeeping()
    job.refresh_from_db()
    key = job.logs_key
    assert key == ""  # its retention had passed: deleted, not archived first
    assert not artifact_path(f"jobs/{job.pk}/logs/chunks.jsonl.gz").exists()
    kept = job_with_logs(teams["vision"], alice, days_ago=100)
    logs_housekeeping()
    kept.refresh_from_db()
    assert kept.logs_key and artifact_path(kept.logs_key).is_file()


def test_a_retention_shorter_than_the_hot_days_deletes_logs_still_in_the_database(alice, teams, settings,
                                                                                   clean_storage):
    """LOG_RETENTION_DAYS 7 with LOG_HOT_DAYS 30 kept a job's logs 30 days, then archived and deleted them (optrial24)."""
    settings.LOG_HOT_DAYS = 30
    settings.LOG_RETENTION_DAYS = 7
    expired = job_with_logs(teams["vision"], alice, days_ago=10)
    kept = job_with_logs(teams["vision"], alice, days_ago=3)
    running = job_with_logs(teams["vision"], alice, state=JobState.RUNNING, days_ago=10)

    done = logs_housekeeping()
    assert (done["deleted_hot_jobs"], done["archived_jobs"], done["deleted_archives"]) == (1, 0, 0)
    expired.refresh_from_db()
    assert not LogChunk.objects.filter(job=expired).exists() and expired.logs_key == ""
    assert not artifact_path(f"jobs/{expired.pk}/logs/chunks.jsonl.gz").exists()  # never archived
    assert LogChunk.objects.filter(job=kept).count() == 30 and LogChunk.objects.filter(job=running).count() == 30
    page = api_client(alice).get(f"/api/v1/jobs/{expired.pk}/logs/").json()
    assert page["results"] == [] and page["note"].startswith("no log: logs are deleted 7 days after a job ends")


def test_while_the_store_is_unreachable_the_logs_stay_in_the_database(alice, teams, settings, clean_storage):
    settings.LOG_HOT_DAYS = 30
    job = job_with_logs(teams["vision"], alice)
    from botocore.config import Config

    nowhere = {**django_settings.STORAGES, "artifacts": {"BACKEND": "storages.backends.s3.S3Storage", "OPTIONS": {
        "bucket_name": "logs", "endpoint_url": f"http://127.0.0.1:{free_port()}", "region_name": "us-east-1",
        "access_key": "k", "secret_key": "s", "client_config": Config(connect_timeout=1, retries={"max_attempts": 1})}}}
    with override_settings(STORAGES=nowhere):
        done = logs_housekeeping()
    assert done["storage_unavailable"] and done["archived_jobs"] == 0
    job.refresh_from_db()
    assert job.logs_key == "" and LogChunk.objects.filter(job=job).count() == 30


@pytest.mark.integration
def test_in_a_bucket_the_logs_read_back_the_same_and_say_when_it_is_unreachable(alice, teams, settings, moto):
    """Against a real S3-compatible server (moto_server): the same bytes through the API and the
    job page's socket; while the store is down the API says 503 with why, the CLI prints it."""
    from tests.s3 import s3_storages, stop_moto

    settings.LOG_HOT_DAYS = 30
    job = job_with_logs(teams["vision"], alice, lines=700)  # more than one API page (500 chunks)
    client = api_client(alice)
    first = client.get(f"/api/v1/jobs/{job.pk}/logs/").content
    second = client.get(f"/api/v1/jobs/{job.pk}/logs/?after=500").content
    storages = s3_storages(moto)
    storages["artifacts"]["OPTIONS"]["client_config"] = __import__("botocore.config").config.Config(
        connect_timeout=1, read_timeout=5, retries={"max_attempts": 1})
    with override_settings(STORAGES=storages):
        assert logs_housekeeping()["archived_chunks"] == 700
        job.refresh_from_db()
        assert job.logs_key and not artifact_path(job.logs_key).exists()  # in the bucket, not on this disk
        assert not LogChunk.objects.filter(job=job).exists()
        assert client.get(f"/api/v1/jobs/{job.pk}/logs/").content == first
        assert client.get(f"/api/v1/jobs/{job.pk}/logs/?after=500").content == second

        stop_moto(moto["process"])
        response = client.get(f"/api/v1/jobs/{job.pk}/logs/")
        assert response.status_code == 503
        assert "archived in the artifact storage" in response.json()["detail"]
        from apps.portal.consumers import load_history

        _, messages = load_history.func(alice, job.pk)
        assert [m["data"]["text"] for m in messages if m["type"] == "log"] == [
            "[this job's logs are archived and the storage cannot be reached right now]\n"]


def test_logs_that_retention_deleted_are_said_to_be_gone(alice, teams, settings, clean_storage):
    """Retention clears the archive and logs_key, so the job looked as if it had never logged:
    the API gave an empty page, `yoloq logs` printed nothing and the page an empty box (optrial24).
    Now the first page says why; a recent job, a later page and a site without retention say nothing."""
    settings.LOG_HOT_DAYS = 30
    settings.LOG_RETENTION_DAYS = 365
    gone = job_with_logs(teams["vision"], alice, days_ago=400)
    recent = job_with_logs(teams["vision"], alice, days_ago=2)
    logs_housekeeping()
    client = api_client(alice)
    body = client.get(f"/api/v1/jobs/{gone.pk}/logs/").json()
    assert body["results"] == []
    assert body["note"].startswith("no log: logs are deleted 365 days after a job ends (LOG_RETENTION_DAYS)")
    assert "note" not in client.get(f"/api/v1/jobs/{gone.pk}/logs/?after=3").json()
    assert "note" not in client.get(f"/api/v1/jobs/{recent.pk}/logs/").json()
    client.force_login(alice)
    page = client.get(f"/jobs/{gone.pk}/").content.decode()
    assert 'id="logs-gone"' in page and "LOG_RETENTION_DAYS" in page
    assert 'id="logs-gone"' not in client.get(f"/jobs/{recent.pk}/").content.decode()
    settings.LOG_RETENTION_DAYS = 0
    assert "note" not in client.get(f"/api/v1/jobs/{gone.pk}/logs/").json()


def test_a_job_that_never_ran_or_a_sweep_is_not_said_to_have_had_its_logs_deleted(alice, teams, settings,
                                                                                    clean_storage):
    """Logs come only from attempts (jobs.services.log_append, from_attempt): a job cancelled while
    queued (first_started_at None, as continuation.py and selectors.py read "never started") and a
    sweep's parent (is_sweep: it never runs itself; its trials log) never had one. Ended longer ago
    than LOG_RETENTION_DAYS they were told "no log: logs are deleted 365 days after a job ends" — a
    deletion that never happened (review26)."""
    settings.LOG_HOT_DAYS = 30
    settings.LOG_RETENTION_DAYS = 365
    long_ago = timezone.now() - timedelta(days=400)
    never_ran = make_job(team=teams["vision"], user=alice, state=JobState.CANCELLED, finished_at=long_ago)
    sweep = make_job(team=teams["vision"], user=alice, state=JobState.SUCCEEDED, is_sweep=True,
                     started_at=long_ago, first_started_at=long_ago, finished_at=long_ago)
    logs_housekeeping()
    client = api_client(alice)
    client.force_login(alice)
    for job in (never_ran, sweep):
        body = client.get(f"/api/v1/jobs/{job.pk}/logs/").json()
        assert body["results"] == [] and "note" not in body, (job.is_sweep, body)
    assert 'id="logs-gone"' not in client.get(f"/jobs/{never_ran.pk}/").content.decode()
