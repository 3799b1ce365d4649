"""API tokens: hashed at rest, several per user, named, expiring, revocable, shown once."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from apps.accounts.models import ApiToken, AuditEntry, hash_token
from tests.conftest import api_client

pytestmark = pytest.mark.django_db


def with_key(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def test_a_new_token_is_shown_once_and_stored_only_as_a_hash(bob):
    response = api_client(bob).post("/api/v1/tokens/", {"name": "laptop", "expires_in_days": 7}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    key = body["key"]
    token = ApiToken.objects.get(pk=body["id"])
    assert token.key_hash == hash_token(key) and key not in (token.key_hash, token.key_prefix)
    assert body["name"] == "laptop" and body["active"] is True
    assert timedelta(days=6) < token.expires_at - timezone.now() <= timedelta(days=7)
    listed = api_client(bob).get("/api/v1/tokens/").json()["results"]
    assert all("key" not in t for t in listed) and {t["name"] for t in listed} == {"laptop", "test"}
    assert with_key(key).get("/api/v1/jobs/").status_code == 200


def test_tokens_default_to_an_expiry(bob, settings):
    body = api_client(bob).post("/api/v1/tokens/", {"name": "ci"}, format="json").json()
    expires = ApiToken.objects.get(pk=body["id"]).expires_at
    assert expires - timezone.now() > timedelta(days=settings.API_TOKEN_DEFAULT_DAYS - 1)


def test_a_revoked_token_stops_working_at_once(bob):
    body = api_client(bob).post("/api/v1/tokens/", {"name": "old"}, format="json").json()
    response = api_client(bob).delete(f"/api/v1/tokens/{body['id']}/")
    assert response.status_code == 200 and response.json()["active"] is False
    assert with_key(body["key"]).get("/api/v1/jobs/").status_code == 401
    assert AuditEntry.objects.filter(action="token.revoke", actor__username="bob").exists()


def test_an_expired_token_is_refused(bob):
    body = api_client(bob).post("/api/v1/tokens/", {"name": "short"}, format="json").json()
    ApiToken.objects.filter(pk=body["id"]).update(expires_at=timezone.now() - timedelta(seconds=1))
    response = with_key(body["key"]).get("/api/v1/jobs/")
    assert response.status_code == 401 and "expired" in response.json()["detail"]


def test_someone_elses_token_is_not_found(bob, carol):
    token_id = api_client(bob).post("/api/v1/tokens/", {"name": "b"}, format="json").json()["id"]
    assert api_client(carol).get(f"/api/v1/tokens/{token_id}/").status_code == 404
    assert api_client(carol).delete(f"/api/v1/tokens/{token_id}/").status_code == 404
    assert ApiToken.objects.get(pk=token_id).is_active
    assert all(t["id"] != token_id for t in api_client(carol).get("/api/v1/tokens/").json()["results"])


@pytest.mark.parametrize(("field", "value"), [
    ("user", "alice"), ("key", "yp_chosen"), ("key_hash", "0" * 64), ("expires_at", "2999-01-01T00:00:00Z"),
    ("revoked_at", None),
])
def test_fields_the_caller_may_not_set_are_refused(field, value, bob):
    response = api_client(bob).post("/api/v1/tokens/", {"name": "x", field: value}, format="json")
    assert response.status_code == 400 and field in response.json()


@pytest.mark.parametrize(("body", "field"), [
    ({"name": ""}, "name"), ({"name": "a" * 101}, "name"), ({"name": "x; rm -rf"}, "name"),
    ({"expires_in_days": 0}, "expires_in_days"), ({"expires_in_days": 99999}, "expires_in_days"),
    ({"expires_in_days": "soon"}, "expires_in_days"),
])
def test_bad_values_name_the_field(body, field, bob):
    response = api_client(bob).post("/api/v1/tokens/", body, format="json")
    assert response.status_code == 400 and field in response.json()


@pytest.mark.parametrize("header", ["Token", "Token a b", "Token yp_not-a-real-key", "Token \u00e9"])
def test_malformed_or_unknown_tokens_are_401(header):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)
    assert client.get("/api/v1/jobs/").status_code == 401


def test_a_bearer_header_is_told_the_scheme_the_api_takes(bob):
    """CI tools send 'Bearer <key>' by default; the 401 said "credentials were not provided" (CI trial 17, H10)."""
    from apps.accounts.services import token_create

    _, key = token_create(user=bob, name="ci")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    response = client.get("/api/v1/jobs/")
    assert response.status_code == 401
    assert response.json() == {"detail": "Authorization header: this API takes 'Token <key>', not 'Bearer <key>'."}


def test_token_creation_is_throttled(bob, monkeypatch):
    from django.core.cache import cache

    from apps.accounts.throttles import AuthThrottle

    cache.clear()
    monkeypatch.setattr(AuthThrottle, "THROTTLE_RATES", {"auth": "3/min"})
    try:
        client = api_client(bob)
        codes = [client.post("/api/v1/tokens/", {"name": f"t{i}"}, format="json").status_code for i in range(5)]
        assert codes == [201, 201, 201, 429, 429]
    finally:
        cache.clear()


def test_login_is_throttled_per_username(bob, settings, client):
    from django.core.cache import cache

    cache.clear()
    settings.REST_FRAMEWORK = settings.REST_FRAMEWORK | {
        "DEFAULT_THROTTLE_RATES": settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"] | {"login": "3/min"}}
    try:
        codes = [client.post("/accounts/login/", {"username": "bob", "password": "wrong"}).status_code
                 for _ in range(4)]
        assert codes == [200, 200, 200, 429]
        assert client.post("/accounts/login/", {"username": "bob", "password": "pw-bob"}).status_code == 429
    finally:
        cache.clear()


def test_issue_token_against_a_data_dir_without_a_database_says_so_without_a_traceback(tmp_path):
    """A new user ran the banner's command without the DATA_DIR `make run` had: a traceback
    ending in "no such table: auth_user". Now one line naming the folder and what to do."""
    import os
    import subprocess
    import sys

    from django.conf import settings

    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"} | {"DATA_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "manage.py", "issue_token", "alice"], cwd=settings.BASE_DIR, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and not out.stdout
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    assert f"DATA_DIR is {tmp_path}" in out.stderr and "run `make run` first" in out.stderr, out.stderr


@pytest.mark.parametrize(("args", "words"), [
    (["--days", "0"], "--days 0: give 1 to 3650 days"),  # was a token that never expires
    (["--days", "-3"], "--days -3: give 1 to 3650 days"),  # was one expired on arrival
    (["--days", "99999"], "give 1 to 3650 days"),
])
def test_issue_token_refuses_an_expiry_that_makes_no_sense(args, words, alice):
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match=words):
        call_command("issue_token", "alice", *args, stdout=io.StringIO())
    assert not ApiToken.objects.filter(user=alice).exists()


def test_issue_token_is_audited_as_the_operator_not_as_the_user(alice):
    """The operator at the shell made alice a token: the log said alice made it (manager trial F29)."""
    from django.core.management import call_command

    from apps.accounts.models import AuditEntry

    call_command("issue_token", "alice", stdout=io.StringIO())
    entry = AuditEntry.objects.get(action="token.create")
    assert (entry.actor, entry.actor_name) == (None, "operator (manage.py issue_token)")
    assert entry.data["user"] == "alice"


def test_issue_token_gives_the_default_expiry_unless_told_no_expiry(alice, settings):
    """A manage.py token never expired unless given --days, though API_TOKEN_DEFAULT_DAYS is the
    expiry of new tokens (manager trial 15, F26); the audit entry said expires_at ''."""
    from datetime import timedelta

    from django.core.management import CommandError, call_command
    from django.utils import timezone

    from apps.accounts.models import AuditEntry

    settings.API_TOKEN_DEFAULT_DAYS = 30
    call_command("issue_token", "alice", "--name", "default", stdout=io.StringIO())
    token = ApiToken.objects.get(user=alice, name="default")
    assert abs(token.expires_at - (timezone.now() + timedelta(days=30))) < timedelta(minutes=1)
    entry = AuditEntry.objects.get(action="token.create", target_id=str(token.pk))
    assert entry.data["expires_at"] == str(token.expires_at)
    call_command("issue_token", "alice", "--name", "robot", "--no-expiry", stdout=io.StringIO())
    assert ApiToken.objects.get(user=alice, name="robot").expires_at is None
    with pytest.raises(CommandError, match="not allowed with"):
        call_command("issue_token", "alice", "--days", "5", "--no-expiry", stdout=io.StringIO())


def test_issue_token_refuses_a_deactivated_user(alice):
    from django.core.management import CommandError, call_command

    alice.is_active = False
    alice.save(update_fields=["is_active"])
    with pytest.raises(CommandError, match="alice is deactivated"):
        call_command("issue_token", "alice", stdout=io.StringIO())
    assert not ApiToken.objects.filter(user=alice).exists()


@pytest.mark.parametrize(("body", "kind"), [([1, 2], "a list"), ("x", "a string"), (7, "a number")])
def test_a_body_that_is_no_object_is_refused_naming_the_body(bob, body, kind):
    """trial26: ``[1,2]`` got DRF's ``non_field_errors: Invalid data. Expected a dictionary``, a 400 that named
    no field; every strict input now names the body and the fields it takes."""
    response = api_client(bob).post("/api/v1/tokens/", body, format="json")
    assert response.status_code == 400
    assert response.json() == {"body": [f"must be a JSON object of the fields (name, expires_in_days), got {kind}"]}


@pytest.mark.parametrize("url", ["/api/v1/tokens/", "/api/v1/notifications/channels/"])
def test_a_body_that_is_no_json_is_refused_naming_the_body(bob, url):
    """A broken JSON body was DRF's {"detail": "JSON parse error - …"} here, where jobs/ names its
    body (spec) and a list is {"body": […]}: no field for a client to key on (trial 32)."""
    response = api_client(bob).post(url, '{"name": ', content_type="application/json")
    assert response.status_code == 400
    assert response.json() == {"body": ["is not valid JSON: Expecting value: line 1 column 10 (char 9)"]}
