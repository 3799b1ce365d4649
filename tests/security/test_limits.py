"""Findings 4 and 7: sign-in throttles on both login pages, counted in Redis; a cap on active jobs;
the portal shares the API's submit throttle."""

from __future__ import annotations

import pytest
import redis
from django.test import Client

from apps.jobs.models import Job, JobState
from tests.conftest import SEED_SPEC, api_client, make_user
from tests.jobs.factories import make_job

pytestmark = pytest.mark.django_db


@pytest.fixture
def login_rate(settings):
    settings.REST_FRAMEWORK = settings.REST_FRAMEWORK | {
        "DEFAULT_THROTTLE_RATES": settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"] | {"login": "3/min"}}


def test_the_admin_login_is_throttled(bob, login_rate):
    client = Client()
    codes = [client.post("/admin/login/", {"username": "bob", "password": "wrong"}).status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    assert client.post("/admin/login/", {"username": "bob", "password": "pw-bob"}).status_code == 429


def test_a_refused_login_says_which_limit_and_when_to_try_again(bob, settings):
    """"wait a minute" whatever THROTTLE_LOGIN said (10/hour: an hour), and no Retry-After (trial 32)."""
    settings.REST_FRAMEWORK = settings.REST_FRAMEWORK | {
        "DEFAULT_THROTTLE_RATES": settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"] | {"login": "2/hour"}}
    client = Client()
    for _ in range(2):
        client.post("/accounts/login/", {"username": "bob", "password": "wrong"})
    response = client.post("/accounts/login/", {"username": "bob", "password": "wrong"})
    assert response.status_code == 429
    assert response["Retry-After"] == "3600"
    assert response.content.decode() == ("Too many sign-in attempts: the login limit is 2/hour. "
                                         "Try again in 60 minutes at the latest.")


def test_the_portal_and_admin_logins_count_together(bob, login_rate):
    client = Client()
    client.post("/accounts/login/", {"username": "bob", "password": "wrong"})
    client.post("/admin/login/", {"username": "bob", "password": "wrong"})
    client.post("/accounts/login/", {"username": "bob", "password": "wrong"})
    assert client.post("/admin/login/", {"username": "bob", "password": "wrong"}).status_code == 429


def test_login_counters_live_in_the_sessions_redis(bob, login_rate, redis_server):
    Client().post("/admin/login/", {"username": "bob", "password": "wrong"})
    keys = [k.decode() for k in redis.Redis.from_url(redis_server.url).keys("*login:user:bob*")]
    assert keys, "the counter is in Redis, where every web process sees it"


def test_a_second_process_sees_the_same_count(bob, login_rate, redis_server, settings):
    """A separate Python process with the same settings reads the counter this process wrote."""
    import json
    import os
    import subprocess
    import sys

    for _ in range(3):
        Client().post("/accounts/login/", {"username": "bob", "password": "wrong"})
    code = ("import django, json; django.setup()\n"
            "from apps.accounts.throttles import login_attempt_allowed\n"
            "print(json.dumps(login_attempt_allowed(ip='10.9.9.9', username='bob', rate=(3, 60))))\n")
    env = dict(os.environ, REDIS_URL=redis_server.url, DJANGO_SETTINGS_MODULE="yoloportal.settings")
    out = subprocess.run([sys.executable, "-c", code], cwd=settings.BASE_DIR, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) is False


def test_throttles_let_requests_through_when_redis_is_down(bob, settings, login_rate):
    from asgiref.local import Local
    from django.core.cache import caches

    settings.CACHES = {"default": settings.CACHES["default"] | {"LOCATION": "redis://127.0.0.1:1/0"}}
    caches._connections = Local()
    response = Client().post("/accounts/login/", {"username": "bob", "password": "pw-bob"})
    assert response.status_code == 302  # signed in: an unreachable cache does not lock people out


# --- finding 7: a cap on active jobs; the portal shares the API's submit throttle ----------------


def submit_api(user):
    return api_client(user).post("/api/v1/jobs/", SEED_SPEC.replace("medium", "low") + "allow_duplicate: true\n",
                                 content_type="application/yaml")


def test_a_user_at_the_active_job_cap_gets_a_429_naming_the_count_and_the_limit(bob, demo_registered, settings,
                                                                                teams):
    settings.MAX_ACTIVE_JOBS_PER_USER = 3
    for state in (JobState.QUEUED, JobState.STARTING, JobState.RUNNING):
        make_job(team=teams["vision"], user=bob, state=state)
    make_job(team=teams["vision"], user=bob, state=JobState.SUCCEEDED)  # finished jobs do not count
    response = submit_api(bob)
    assert response.status_code == 429, response.content
    body = response.json()
    assert (body["active_jobs"], body["limit"]) == (3, 3)
    assert "3 active" in body["detail"] and "limit is 3" in body["detail"]
    assert Job.objects.filter(user=bob).count() == 4


def test_the_active_job_cap_says_when_to_try_again(bob, demo_registered, settings, teams):
    """A 429 without Retry-After: a CI client retrying on 429 had no wait to honour (trial 32)."""
    settings.MAX_ACTIVE_JOBS_PER_USER = 1
    make_job(team=teams["vision"], user=bob)
    response = submit_api(bob)
    assert response.status_code == 429, response.content
    assert int(response["Retry-After"]) > 0
    assert f"Try again in {response['Retry-After']} seconds" in response.json()["detail"]


def test_a_cap_lowered_below_what_a_user_has_still_names_the_exact_count(bob, demo_registered, settings, teams):
    """Submit counts active jobs only up to the cap; the refusal counts them all."""
    for _ in range(5):
        make_job(team=teams["vision"], user=bob)
    settings.MAX_ACTIVE_JOBS_PER_USER = 2
    response = submit_api(bob)
    assert response.status_code == 429, response.content
    assert (response.json()["active_jobs"], response.json()["limit"]) == (5, 2)


def test_the_active_count_stops_at_the_cap(bob, demo_registered, teams):
    from apps.jobs.services import active_jobs_count

    for state in (JobState.QUEUED, JobState.QUEUED, JobState.STARTING, JobState.RUNNING, JobState.FAILED):
        make_job(team=teams["vision"], user=bob, state=state)
    assert active_jobs_count(bob.pk, limit=100) == 4
    assert active_jobs_count(bob.pk, limit=3) == 3


def test_the_cap_is_per_user(bob, demo_registered, settings, teams):
    settings.MAX_ACTIVE_JOBS_PER_USER = 1
    make_job(team=teams["vision"], user=bob)
    assert submit_api(make_user("erin", teams["vision"])).status_code == 201


def portal(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def portal_submit(client):
    return client.post("/jobs/new/", {"mode": "yaml", "y-spec_text": SEED_SPEC + "allow_duplicate: true\n"})


def test_the_portal_submit_and_resubmit_hit_the_same_cap(bob, demo_registered, settings, teams):
    settings.MAX_ACTIVE_JOBS_PER_USER = 1
    first = submit_api(bob)
    assert first.status_code == 201
    client = portal(bob)
    response = portal_submit(client)
    assert response.status_code == 429 and "limit is 1" in response.content.decode()
    response = client.post(f"/jobs/{first.json()['id']}/resubmit/")
    assert response.status_code == 429 and "limit is 1" in response.content.decode()
    assert Job.objects.filter(user=bob).count() == 1


def test_the_portal_counts_against_the_apis_submit_throttle(bob, demo_registered, monkeypatch):
    from apps.accounts.throttles import SubmitThrottle

    monkeypatch.setattr(SubmitThrottle, "THROTTLE_RATES", {"submit": "2/min"})
    client = portal(bob)
    assert submit_api(bob).status_code == 201
    assert portal_submit(client).status_code == 302
    response = portal_submit(client)
    assert response.status_code == 429 and "Too many submissions" in response.content.decode()
    assert client.post(f"/jobs/{Job.objects.first().pk}/resubmit/").status_code == 429
    assert submit_api(bob).status_code == 429
    assert Job.objects.filter(user=bob).count() == 2


def test_dataset_uploads_are_throttled(bob, monkeypatch, settings, tmp_path):
    from apps.accounts.throttles import UploadThrottle
    from tests.datasets.archives import make_zip, upload, valid_files

    settings.DATASETS_DIR = tmp_path / "datasets"
    monkeypatch.setattr(UploadThrottle, "THROTTLE_RATES", {"upload": "1/hour"})
    client = api_client(bob)
    content = make_zip(valid_files())
    assert client.post("/api/v1/datasets/", {"file": upload(content), "name": "a"}, format="multipart").status_code \
        == 201
    response = client.post("/api/v1/datasets/", {"file": upload(content), "name": "b"}, format="multipart")
    assert response.status_code == 429


def _post_dataset(client, content: bytes, name: str):
    from tests.datasets.archives import upload

    return client.post("/api/v1/datasets/", {"file": upload(content), "name": name}, format="multipart")


def _post_weights(client, content: bytes):
    from django.core.files.uploadedfile import SimpleUploadedFile

    return client.post("/api/v1/weights/", {"file": SimpleUploadedFile("mine.pt", content)}, format="multipart")


@pytest.fixture
def two_uploads_an_hour(monkeypatch, settings, tmp_path):
    from apps.accounts.throttles import UploadThrottle

    settings.DATASETS_DIR = tmp_path / "datasets"
    settings.MODELS_DIR = tmp_path / "models"
    monkeypatch.setattr(UploadThrottle, "THROTTLE_RATES", {"upload": "2/hour"})


def test_refused_uploads_do_not_count_against_the_upload_limit(bob, two_uploads_an_hour):
    """A new user iterating on a broken zip (trial16 G16): the refusals, datasets or weights, leave
    the limit for the uploads that are stored; the 429 then says the wait in minutes."""
    from tests.datasets.archives import make_zip, valid_files

    client = api_client(bob)
    broken = make_zip(valid_files() | {"labels/train/0.txt": b"7 0.5 0.5 0.2 0.2\n"})
    assert [_post_dataset(client, b"garbage, not a zip", "a").status_code for _ in range(3)] == [400] * 3
    assert _post_dataset(client, broken, "a").status_code == 400
    assert _post_weights(client, b"not a checkpoint").status_code == 400
    assert _post_dataset(client, make_zip(valid_files()), "a").status_code == 201
    assert _post_dataset(client, make_zip(valid_files()), "b").status_code == 201
    response = _post_dataset(client, make_zip(valid_files()), "c")
    assert response.status_code == 429
    assert response.json() == {"limit": "2/hour", "detail": "Request was throttled: the upload limit is 2/hour. "
                                                            "Expected available in 60 minutes."}
    assert 3500 <= int(response["Retry-After"]) <= 3600


def test_an_unchanged_upload_does_not_count_against_the_upload_limit(bob, two_uploads_an_hour):
    """Pushing the same folder again (a script's every run, or a retry) answered 200 "unchanged" and
    still used one of the hour's uploads; it counts with the refused ones now (weights settle the
    same way: RefundsRefusedUploads)."""
    from tests.datasets.archives import make_zip, valid_files

    client = api_client(bob)
    content = make_zip(valid_files())
    assert _post_dataset(client, content, "a").status_code == 201
    assert [_post_dataset(client, content, "a").status_code for _ in range(3)] == [200] * 3
    assert _post_dataset(client, make_zip(valid_files()), "b").status_code == 201
    response = _post_dataset(client, make_zip(valid_files()), "c")
    assert response.status_code == 429 and response.json()["limit"] == "2/hour"


def test_the_default_upload_limit_leaves_room_to_iterate_on_a_dataset():
    """20 new versions an hour was hit while fixing labels in a loop; disk is bounded by the team's
    storage quota, so the count only stops a flood."""
    from django.conf import settings

    assert settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]["upload"] == "60/hour"


def test_a_flood_of_refused_uploads_is_cut_off_at_five_times_the_limit(bob, alice, two_uploads_an_hour):
    from tests.datasets.archives import make_zip, valid_files

    client = api_client(bob)
    assert {_post_dataset(client, b"garbage", "a").status_code for _ in range(9)} == {400}
    assert _post_weights(client, b"garbage").status_code == 400
    response = _post_dataset(client, b"garbage", "a")
    assert response.status_code == 429
    body = response.json()
    assert body["limit"] == "10/hour"
    assert body["detail"].startswith("Request was throttled: the limit on refused uploads is 10/hour")
    assert body["detail"].endswith("Expected available in 60 minutes.")
    assert _post_dataset(client, make_zip(valid_files()), "b").status_code == 429, "the flood stops every upload"
    assert _post_dataset(api_client(alice), make_zip(valid_files()), "b").status_code == 201, "per user"


def test_waits_past_ninety_seconds_read_in_minutes():
    from apps.core.api import wait_text

    assert [wait_text(s) for s in (0.2, 1, 42, 90, 90.5, 2564, 3600)] == [
        "1 second", "1 second", "42 seconds", "90 seconds", "2 minutes", "43 minutes", "60 minutes"]
