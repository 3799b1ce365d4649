"""Notifications: from a job event to a signed webhook / an email, with retries and a delivery log."""

from __future__ import annotations

import json
import logging
from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from apps.jobs.models import JobState
from apps.jobs.services import job_event, job_requeue, job_transition
from apps.notifications.models import Channel, Delivery
from apps.notifications.services import channel_create, preference_update
from apps.notifications.signing import verify
from apps.quotas.models import UsageRecord
from apps.scheduling.models import SchedulerConfig
from tests.conftest import api_client
from tests.jobs.factories import make_job

from .helpers import run_notifications

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("instant_retries")]


@pytest.fixture
def instant_retries(settings):
    settings.NOTIFY_RETRY_INTERVALS = [0, 0, 0]
    settings.NOTIFY_TIMEOUT_S = 5


@pytest.fixture
def smtp(settings, mail_server):
    settings.NOTIFY_SMTP_HOST, settings.NOTIFY_SMTP_PORT = "127.0.0.1", mail_server.port
    settings.NOTIFY_FROM = "portal@example.org"
    return mail_server


def finish(job, state: str, django_capture_on_commit_callbacks, **fields) -> None:
    """What the worker does at the end of an attempt: the transition, then the event."""
    with django_capture_on_commit_callbacks(execute=True):
        assert job_transition(job.pk, expected=[JobState.RUNNING], to=state, **fields)
        job.refresh_from_db()
        job_event(job, state, f"{state} for the test")
    run_notifications()


@pytest.fixture
def running_job(teams, bob, node):
    now = timezone.now()
    return make_job(team=teams["vision"], user=bob, state="running", node=node, gpu_indices=[0],
                    task_name="pcb-detector", queued_at=now - timedelta(minutes=2), started_at=now)


def test_a_webhook_carries_the_exact_body_signed_with_the_channels_secret(
        running_job, bob, receiver, django_capture_on_commit_callbacks):
    channel = channel_create(by=bob, name="my hook", kind="webhook", target=receiver.url)
    finish(running_job, "succeeded", django_capture_on_commit_callbacks)

    [post] = receiver.received
    headers = post.headers
    assert verify(channel.secret, timestamp=headers["x-yoloportal-timestamp"], body=post.body,
                  signature=headers["x-yoloportal-signature"])
    assert not verify("whsec_another", timestamp=headers["x-yoloportal-timestamp"], body=post.body,
                      signature=headers["x-yoloportal-signature"])
    assert not verify(channel.secret, timestamp=headers["x-yoloportal-timestamp"], body=post.body + b" ",
                      signature=headers["x-yoloportal-signature"])
    payload = json.loads(post.body)
    assert payload["event"] == "succeeded" and payload["job"]["id"] == str(running_job.pk)
    assert payload["job"]["team"] == "vision" and headers["x-yoloportal-event"] == "succeeded"
    delivery = Delivery.objects.get()
    assert (delivery.state, delivery.attempts, delivery.response_status) == ("sent", 1, 200)


def test_a_failing_endpoint_is_retried_until_it_answers(running_job, bob, receiver,
                                                        django_capture_on_commit_callbacks):
    receiver.statuses = [500, 503]
    channel_create(by=bob, name="flaky", kind="webhook", target=receiver.url)
    finish(running_job, "failed", django_capture_on_commit_callbacks, error="CUDA out of memory")
    assert len(receiver.received) == 3
    delivery = Delivery.objects.get()
    assert (delivery.state, delivery.attempts, delivery.last_error) == ("sent", 3, "")
    # Each try is signed afresh over the same body.
    assert len({r.body for r in receiver.received}) == 1


def test_an_endpoint_that_never_answers_ends_failed_with_its_error_logged(
        running_job, bob, receiver, django_capture_on_commit_callbacks):
    receiver.statuses = [500] * 10
    channel_create(by=bob, name="down", kind="webhook", target=receiver.url)
    finish(running_job, "failed", django_capture_on_commit_callbacks)
    delivery = Delivery.objects.get()
    assert len(receiver.received) == 4  # the first try and three retries
    assert (delivery.state, delivery.attempts, delivery.response_status) == ("failed", 4, 500)
    assert "HTTP 500" in delivery.last_error


def test_a_retried_failure_is_one_warning_and_only_the_last_try_logs_an_error(
        running_job, bob, receiver, caplog, django_capture_on_commit_callbacks):
    """Each retried try logged a WARNING and RQ's ERROR with a ~25-line traceback (manager trial 15, F24)."""
    receiver.statuses = [500] * 10
    channel_create(by=bob, name="down", kind="webhook", target=receiver.url)
    with caplog.at_level(logging.INFO):
        finish(running_job, "failed", django_capture_on_commit_callbacks)
    warnings = [r.getMessage() for r in caplog.records if r.name == "apps.notifications.tasks"]
    assert len(warnings) == 4 and all("HTTP 500" in w and "\n" not in w for w in warnings)
    assert "attempt 1 of 4, next in 0 s" in warnings[0] and "attempt 4 of 4, giving up" in warnings[3]
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "HTTP 500" in errors[0].getMessage()  # the last try's, with its traceback


def test_an_email_reaches_a_real_smtp_server(running_job, bob, smtp, django_capture_on_commit_callbacks):
    channel_create(by=bob, name="mail", kind="email", target="bob@example.org")
    finish(running_job, "timed_out", django_capture_on_commit_callbacks, error="exceeded its timeout of 3600 s")
    [mail] = smtp.messages
    assert mail.mail_from == "portal@example.org" and mail.rcpt_tos == ["bob@example.org"]
    text = mail.content.decode(errors="replace")
    assert "pcb-detector timed out" in text and str(running_job.pk) in text
    assert Delivery.objects.get().state == "sent"


def test_an_email_the_mail_server_refuses_says_which_server(
        running_job, bob, settings, django_capture_on_commit_callbacks):
    """It said "see the worker log", which a manager cannot read (manager trial)."""
    from tests.portal.liveweb import free_port

    settings.NOTIFY_SMTP_HOST, settings.NOTIFY_SMTP_PORT = "127.0.0.1", free_port()  # nothing listens
    channel_create(by=bob, name="mail", kind="email", target="bob@example.org")
    finish(running_job, "failed", django_capture_on_commit_callbacks)
    delivery = Delivery.objects.get()
    assert f"the mail server 127.0.0.1:{settings.NOTIFY_SMTP_PORT} (NOTIFY_SMTP_HOST, NOTIFY_SMTP_PORT) did not " \
           "take the mail" in delivery.last_error
    assert "worker log" not in delivery.last_error


def test_preferences_decide_which_events_reach_personal_channels(
        running_job, bob, receiver, django_capture_on_commit_callbacks):
    channel_create(by=bob, name="hook", kind="webhook", target=receiver.url)
    preference_update(user=bob, on_succeeded=False)
    finish(running_job, "succeeded", django_capture_on_commit_callbacks)
    assert receiver.received == [] and not Delivery.objects.exists()


def test_preemption_is_sent_only_to_those_who_asked(teams, bob, alice, node, receiver,
                                                     django_capture_on_commit_callbacks):
    job = make_job(team=teams["vision"], user=bob, state="running", node=node, gpu_indices=[0],
                   started_at=timezone.now())
    channel_create(by=bob, name="hook", kind="webhook", target=receiver.url)  # preempted is off by default
    with django_capture_on_commit_callbacks(execute=True):
        job_requeue(job, reason="preempted: an urgent job", kind="preempted")
    run_notifications()
    assert receiver.received == []
    preference_update(user=bob, on_preempted=True)
    job.refresh_from_db()
    job_transition(job.pk, expected=[JobState.QUEUED], to=JobState.RUNNING, started_at=timezone.now())
    job.refresh_from_db()
    with django_capture_on_commit_callbacks(execute=True):
        job_requeue(job, reason="preempted again", kind="preempted")
    run_notifications()
    assert [json.loads(r.body)["event"] for r in receiver.received] == ["preempted"]


def test_a_start_after_a_long_wait_is_news_and_a_short_wait_is_not(teams, bob, node, receiver,
                                                                    django_capture_on_commit_callbacks):
    channel_create(by=bob, name="hook", kind="webhook", target=receiver.url)
    preference_update(user=bob, on_started_late=True, started_late_minutes=30)
    now = timezone.now()
    for waited in (45, 5):
        job = make_job(team=teams["vision"], user=bob, state="running", node=node, task_name=f"waited-{waited}",
                       queued_at=now - timedelta(minutes=waited), started_at=now)
        with django_capture_on_commit_callbacks(execute=True):
            job_event(job, "running", "running on node-a")
    run_notifications()
    [post] = receiver.received
    payload = json.loads(post.body)
    assert payload["event"] == "started_late" and payload["job"]["task_name"] == "waited-45"
    assert payload["wait_seconds"] == pytest.approx(45 * 60, abs=5)


def test_quota_nearly_used_is_said_once_a_day(teams, bob, node, receiver, django_capture_on_commit_callbacks):
    SchedulerConfig.current()
    SchedulerConfig.objects.update(user_gpu_hours_per_day=1.0)
    channel_create(by=bob, name="hook", kind="webhook", target=receiver.url)
    preference_update(user=bob, on_succeeded=False, on_quota_nearly_used=True, quota_percent=80)
    now = timezone.now()
    for _ in range(2):
        job = make_job(team=teams["vision"], user=bob, state="running", node=node, started_at=now)
        UsageRecord.objects.create(job=job, team=teams["vision"], user=bob, attempt=1, priority_class="medium",
                                   gpu_seconds=0.45 * 3600, started_at=now - timedelta(hours=1), ended_at=now)
        finish(job, "succeeded", django_capture_on_commit_callbacks)
    [post] = receiver.received  # 0.45 h is under 80 % of 1 h; 0.9 h is over; the second time is not news
    payload = json.loads(post.body)
    assert payload["event"] == "quota_nearly_used" and payload["quota_gpu_hours_24h"] == 1.0
    assert payload["gpu_hours_24h"] == pytest.approx(0.9, abs=0.01)


def test_team_channels_carry_their_teams_jobs_and_nothing_reaches_another_team(
        teams, alice, bob, carol, running_job, receiver, django_capture_on_commit_callbacks):
    vision_hook = channel_create(by=alice, team=teams["vision"], name="vision ops", kind="webhook",
                                 target=receiver.url + "/vision", events=["failed", "succeeded"])
    # Carol is in robotics: her own channel and her team's must hear nothing of vision's jobs.
    from tests.conftest import make_user

    robotics_manager = make_user("rita", teams["robotics"], "manager")
    channel_create(by=carol, name="carol", kind="webhook", target=receiver.url + "/carol")
    channel_create(by=robotics_manager, team=teams["robotics"], name="robotics ops", kind="webhook",
                   target=receiver.url + "/robotics", events=["failed", "succeeded", "timed_out", "preempted"])
    finish(running_job, "failed", django_capture_on_commit_callbacks)
    assert [r.path for r in receiver.received] == ["/hook/vision"]
    assert verify(vision_hook.secret, timestamp=receiver.received[0].headers["x-yoloportal-timestamp"],
                  body=receiver.received[0].body, signature=receiver.received[0].headers["x-yoloportal-signature"])
    assert set(Delivery.objects.values_list("channel__name", flat=True)) == {"vision ops"}


def test_a_job_event_only_queues_work_and_survives_redis_being_down(running_job, bob, receiver,
                                                                    django_capture_on_commit_callbacks):
    channel_create(by=bob, name="hook", kind="webhook", target=receiver.url)
    with override_settings(REDIS_URL="redis://127.0.0.1:1/0"), django_capture_on_commit_callbacks(execute=True):
        from apps.core import redis_client as core_redis

        saved, core_redis._client = core_redis._client, None
        try:
            job_transition(running_job.pk, expected=[JobState.RUNNING], to=JobState.SUCCEEDED)
            job_event(running_job, "succeeded")  # must not raise
        finally:
            core_redis._client = saved
    assert not Delivery.objects.exists()  # nothing is sent from the job's own process


# --- the API: channels, preferences, delivery log ------------------------------------------------


def test_only_a_teams_manager_may_set_its_channels(teams, alice, bob, receiver):
    refused = api_client(bob).post("/api/v1/notifications/channels/", {
        "name": "x", "kind": "webhook", "target": receiver.url, "team": "vision", "events": ["failed"]},
        format="json")
    assert refused.status_code == 400 and "team" in refused.json()
    created = api_client(alice).post("/api/v1/notifications/channels/", {
        "name": "vision ops", "kind": "webhook", "target": receiver.url, "team": "vision", "events": ["failed"]},
        format="json")
    assert created.status_code == 201 and created.json()["secret"].startswith("whsec_")
    listed = api_client(alice).get("/api/v1/notifications/channels/").json()["results"]
    assert [c["name"] for c in listed] == ["vision ops"] and "secret" not in listed[0]
    assert api_client(bob).get("/api/v1/notifications/channels/").json()["results"] == []


def test_a_team_channel_is_audited_where_it_points_and_only_a_webhook_gets_a_secret(teams, alice, receiver):
    """A team webhook hears every team job's name, user, state and errors: creating or deleting
    one was not audited, and an email channel's 201 carried a webhook secret (manager trial)."""
    from apps.accounts.models import AuditEntry

    client = api_client(alice)
    hook = client.post("/api/v1/notifications/channels/", {
        "name": "vision ops", "kind": "webhook", "target": receiver.url + "?token=s3cret", "team": "vision",
        "events": ["failed"]}, format="json")
    assert hook.status_code == 201 and hook.json()["secret"].startswith("whsec_")
    mail = client.post("/api/v1/notifications/channels/", {
        "name": "mine", "kind": "email", "target": "alice@example.com"}, format="json")
    assert mail.status_code == 201 and "secret" not in mail.json()
    assert client.delete(f"/api/v1/notifications/channels/{hook.json()['id']}/").status_code == 204
    created, personal, deleted = AuditEntry.objects.filter(action__startswith="channel.").order_by("pk")
    assert (created.action, created.team.slug, created.actor_name) == ("channel.create", "vision", "alice")
    assert created.message == "team vision webhook channel 'vision ops' to 127.0.0.1 created"
    assert created.data["hosts"] == ["127.0.0.1"] and "s3cret" not in str(created.data) + created.message
    assert (personal.team, personal.data["hosts"]) == (None, ["alice@example.com"])
    assert (deleted.action, deleted.target_id) == ("channel.delete", str(hook.json()["id"]))
    audit = client.get("/api/v1/audit/", {"team": "vision"}).json()["results"]
    assert {"channel.create", "channel.delete"} <= {e["action"] for e in audit}  # the team's managers see them


def test_channel_input_errors_name_the_field(bob):
    client = api_client(bob)
    bad = client.post("/api/v1/notifications/channels/", {"name": "m", "kind": "email", "target": "not-an-address"},
                      format="json")
    assert bad.status_code == 400 and "email address" in bad.json()["target"][0]
    bad = client.post("/api/v1/notifications/channels/", {"name": "w", "kind": "webhook", "target": "ftp://x"},
                      format="json")
    assert bad.status_code == 400 and "http(s)" in bad.json()["target"][0]
    bad = client.post("/api/v1/notifications/channels/", {"name": "w", "kind": "webhook", "target": "http://x.org",
                                                          "secret": "mine"}, format="json")
    assert bad.status_code == 400 and "secret" in bad.json()
    bad = client.patch("/api/v1/notifications/preferences/", {"quota_percent": 150}, format="json")
    assert bad.status_code == 400 and "quota_percent" in bad.json()


def test_the_delivery_log_is_the_owners(running_job, bob, carol, receiver, django_capture_on_commit_callbacks):
    receiver.statuses = [500]
    channel_create(by=bob, name="hook", kind="webhook", target=receiver.url)
    finish(running_job, "succeeded", django_capture_on_commit_callbacks)
    [entry] = api_client(bob).get("/api/v1/notifications/deliveries/").json()["results"]
    assert (entry["event"], entry["state"], entry["attempts"], entry["channel"]) == ("succeeded", "sent", 2, "hook")
    assert api_client(carol).get("/api/v1/notifications/deliveries/").json()["results"] == []


def test_the_delivery_log_names_the_job_each_delivery_was_about(running_job, bob, receiver,
                                                                django_capture_on_commit_callbacks):
    """API: the job's id and task name; portal: its task name linking to its page (trial 16, G19)."""
    from django.test import Client

    channel_create(by=bob, name="hook", kind="webhook", target=receiver.url)
    finish(running_job, "failed", django_capture_on_commit_callbacks, error="CUDA error")
    [entry] = api_client(bob).get("/api/v1/notifications/deliveries/").json()["results"]
    assert (entry["job"], entry["task_name"]) == (str(running_job.pk), "pcb-detector")
    page = Client()
    page.force_login(bob)
    html = page.get("/notifications/").content.decode()
    assert f'<a href="/jobs/{running_job.pk}/">pcb-detector</a>' in html


def test_a_job_a_manager_cancels_tells_its_owner_and_the_team_who_cancelled_it(
        running_job, alice, bob, receiver, django_capture_on_commit_callbacks):
    """A running job: the manager's cancel request names who; the worker's stop sends it (trial 16, G8)."""
    channel_create(by=bob, name="mine", kind="webhook", target=receiver.url)
    channel_create(by=alice, name="team", kind="webhook", target=receiver.url, team=running_job.team,
                   events=["cancelled"])
    with django_capture_on_commit_callbacks(execute=True):
        assert api_client(alice).post(f"/api/v1/jobs/{running_job.pk}/cancel/").status_code == 202
    run_notifications()
    assert receiver.received == []  # only asked: the job still runs
    finish(running_job, "cancelled", django_capture_on_commit_callbacks)
    payloads = [json.loads(post.body) for post in receiver.received]
    assert len(payloads) == 2 and {p["event"] for p in payloads} == {"cancelled"}
    assert {p["message"] for p in payloads} == {"pcb-detector was cancelled by alice"}
    assert {p["cancelled_by"] for p in payloads} == {"alice"}


def test_a_departure_cancelling_queued_jobs_says_why(teams, alice, bob, receiver, django_capture_on_commit_callbacks):
    from apps.jobs.departures import departure_apply

    make_job(team=teams["vision"], user=bob, task_name="waiting-one")
    channel_create(by=bob, name="mine", kind="webhook", target=receiver.url)
    with django_capture_on_commit_callbacks(execute=True):
        departure_apply(user=bob, team=teams["vision"], by=alice)
    run_notifications()
    [post] = receiver.received
    payload = json.loads(post.body)
    assert payload["message"] == "waiting-one was cancelled by alice: its owner bob was removed from vision"
    assert payload["reason"] == "its owner bob was removed from vision"


def test_cancelling_ones_own_job_sends_nothing_and_the_preference_mutes_others_cancels(
        teams, alice, bob, receiver, django_capture_on_commit_callbacks):
    channel_create(by=bob, name="mine", kind="webhook", target=receiver.url)
    own, other = (make_job(team=teams["vision"], user=bob, task_name=name) for name in ("own", "other"))
    with django_capture_on_commit_callbacks(execute=True):
        assert api_client(bob).post(f"/api/v1/jobs/{own.pk}/cancel/").status_code == 202
    run_notifications()
    assert receiver.received == []
    preference_update(user=bob, on_cancelled=False)
    with django_capture_on_commit_callbacks(execute=True):
        assert api_client(alice).post(f"/api/v1/jobs/{other.pk}/cancel/").status_code == 202
    run_notifications()
    assert receiver.received == [] and not Delivery.objects.exists()


def test_an_unknown_event_is_refused_with_the_valid_ones(teams, alice):
    response = api_client(alice).post("/api/v1/notifications/channels/", {
        "name": "t", "kind": "webhook", "target": "https://hooks.example.org/x", "team": "vision",
        "events": ["failed", "canceled"]}, format="json")
    assert response.status_code == 400
    [problem] = response.json()["events"]["1"]
    assert "canceled" in problem and "succeeded, failed, timed_out" in problem and "cancelled" in problem


def test_preferences_round_trip(bob):
    client = api_client(bob)
    assert client.get("/api/v1/notifications/preferences/").json()["on_failed"] is True
    response = client.patch("/api/v1/notifications/preferences/", {"on_started_late": True,
                                                                   "started_late_minutes": 15}, format="json")
    assert response.status_code == 200 and response.json()["started_late_minutes"] == 15
    assert Channel.objects.count() == 0


def test_internal_addresses_are_refused_unless_allowed(running_job, bob, receiver, settings,
                                                       django_capture_on_commit_callbacks):
    settings.NOTIFY_ALLOW_PRIVATE_TARGETS = False
    for target in (receiver.url, "http://10.0.0.5/hook", "http://169.254.169.254/latest/meta-data/",
                   "http://[::1]:6390/"):
        response = api_client(bob).post("/api/v1/notifications/channels/",
                                        {"name": "x", "kind": "webhook", "target": target}, format="json")
        assert response.status_code == 400 and "internal address" in response.json()["target"][0], target
    bad = api_client(bob).post("/api/v1/notifications/channels/",
                               {"name": "x", "kind": "apprise", "target": "json://127.0.0.1:6390/"}, format="json")
    assert bad.status_code == 400 and "internal address" in bad.json()["target"][0]
    # A channel stored while allowed (or whose name now resolves inside) is refused at send time.
    Channel.objects.create(user=bob, name="old", kind="webhook", target=receiver.url)
    finish(running_job, "succeeded", django_capture_on_commit_callbacks)
    assert receiver.received == []
    delivery = Delivery.objects.get()
    assert delivery.state == "failed" and "internal address" in delivery.last_error


# A cloud service's apprise URL carries a token where a host would be: Slack's workspace token,
# Discord's webhook id, Pushover's user key. None is a host, so none resolves.
CLOUD_SERVICE_TARGETS = ["slack://T1JJ3T3L2/A1BRTD4JD/TIiajkdnlazkcOXrIdevi7FQ",
                         "discord://4174216298123456789/JHMHI8qBe7bk2ZwO5U711o3dV_js",
                         "pover://uuuuuuuuuuuuuuuuuuuuuuuuuuuuuu@aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"]


def no_such_host(host, *args, **kwargs):
    import socket

    raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")


@pytest.mark.parametrize("target", CLOUD_SERVICE_TARGETS, ids=["slack", "discord", "pushover"])
def test_a_cloud_services_apprise_channel_is_taken_and_sent_with_private_targets_refused(
        target, bob, settings, monkeypatch):
    """The address check resolved apprise's ``host``, which for these services is a token: "T1JJ3T3L2
    does not resolve" refused every Slack, Discord or Pushover channel (the refusal's own examples),
    and failed each delivery to one made while private targets were allowed (trial28 F6). What does
    not resolve reaches nothing inside; the check is made again at send time."""
    import socket

    import apprise

    settings.NOTIFY_ALLOW_PRIVATE_TARGETS = False
    monkeypatch.setattr(socket, "getaddrinfo", no_such_host)
    response = api_client(bob).post("/api/v1/notifications/channels/", {"name": "chat", "kind": "apprise",
                                                                        "target": target}, format="json")
    assert response.status_code == 201, response.json()
    sent = []
    monkeypatch.setattr(apprise.Apprise, "notify", lambda self, **kwargs: sent.append(kwargs) or True)
    answer = api_client(bob).post(f"/api/v1/notifications/channels/{response.json()['id']}/test/").json()
    assert answer["delivered"] is True, answer
    assert len(sent) == 1


# apprise URLs whose host is the one they connect to: a JSON/XML/form post, a mail server.
REAL_HOST_TARGETS = ["json://hooks.exmaple.org/x", "xml://hooks.exmaple.org/x", "form://hooks.exmaple.org/x",
                     "mailtos://u:p@example.org?smtp=mail.exmaple.org", "slack://T1JJ3T3L2/A1BRTD4JD/TIiajkdnlazk "
                                                                         "json://T1JJ3T3L2/x"]


@pytest.mark.parametrize("target", REAL_HOST_TARGETS, ids=["json", "xml", "form", "smtp", "slack-and-json"])
def test_an_apprise_channel_whose_host_is_real_and_does_not_resolve_is_refused(target, bob, settings, monkeypatch):
    """json://, xml:// and form:// post to their host and mail goes to its SMTP host, as a webhook posts
    to its own: one that does not resolve at the check may resolve for apprise's own lookup a moment
    later, to an internal address. Only a cloud service's token is let through (review28)."""
    import socket

    settings.NOTIFY_ALLOW_PRIVATE_TARGETS = False
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *a, **k: (
        [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.215.14", 0))] if host == "example.org"
        else no_such_host(host)))
    response = api_client(bob).post("/api/v1/notifications/channels/", {"name": "hook", "kind": "apprise",
                                                                        "target": target}, format="json")
    assert response.status_code == 400, response.json()
    assert "does not resolve" in response.json()["target"][0]


def test_an_apprise_channel_whose_host_stops_resolving_is_not_sent(bob, settings, monkeypatch):
    """The check is made again at send time, with the same rule."""
    import socket

    import apprise

    settings.NOTIFY_ALLOW_PRIVATE_TARGETS = False
    public = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.215.14", 0))]
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: public)
    response = api_client(bob).post("/api/v1/notifications/channels/", {
        "name": "hook", "kind": "apprise", "target": "json://hooks.example.org/x"}, format="json")
    assert response.status_code == 201, response.json()
    monkeypatch.setattr(socket, "getaddrinfo", no_such_host)
    sent = []
    monkeypatch.setattr(apprise.Apprise, "notify", lambda self, **kwargs: sent.append(kwargs) or True)
    answer = api_client(bob).post(f"/api/v1/notifications/channels/{response.json()['id']}/test/").json()
    assert answer["delivered"] is False, answer
    assert sent == []


def mx_only(host, *args, **kwargs):
    """DNS where mx-only.example.org has only an MX record (no address) and the rest is public."""
    import socket

    if host in ("mx-only.example.org", "mail.mx-only.example.org"):
        return no_such_host(host)
    return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.215.14", 0))]


def test_a_mail_url_from_a_domain_with_only_an_mx_record_is_taken_when_it_names_its_smtp_server(
        bob, settings, monkeypatch):
    """apprise's mail connects to its SMTP server (``?smtp=``) only; the URL's host is the sender's
    domain, which need have no address: "mx-only.example.org does not resolve" refused it."""
    import socket

    settings.NOTIFY_ALLOW_PRIVATE_TARGETS = False
    monkeypatch.setattr(socket, "getaddrinfo", mx_only)
    response = api_client(bob).post("/api/v1/notifications/channels/", {
        "name": "mail", "kind": "apprise", "target": "mailtos://me:pw@mx-only.example.org?smtp=smtp.example.net"},
        format="json")
    assert response.status_code == 201, response.json()


@pytest.mark.parametrize(("kind", "target", "dns", "said"), [
    # A webhook's URL names the host it posts to: one that does not resolve is a typo, said at once.
    ("webhook", "https://hooks.exmaple.org/x", no_such_host, "hooks.exmaple.org does not resolve"),
    # Without ``?smtp=`` apprise connects to the mail domain itself (never its MX): refused, saying how to fix it.
    ("apprise", "mailtos://me:pw@mx-only.example.org", mx_only,
     "mx-only.example.org does not resolve (mail is sent to mx-only.example.org itself, the host of the mailto:// "
     "URL: name your mail server with ?smtp=, e.g. mailtos://user:pass@mx-only.example.org?smtp=smtp.mx-only."
     "example.org)"),
], ids=["webhook", "mail-domain-without-smtp"])
def test_a_channel_whose_connected_host_does_not_resolve_is_refused_saying_which(kind, target, dns, said, bob,
                                                                                 settings, monkeypatch):
    import socket

    settings.NOTIFY_ALLOW_PRIVATE_TARGETS = False
    monkeypatch.setattr(socket, "getaddrinfo", dns)
    response = api_client(bob).post("/api/v1/notifications/channels/", {"name": "hook", "kind": kind,
                                                                        "target": target}, format="json")
    assert response.status_code == 400
    assert response.json()["target"] == [said]


def test_a_preemption_message_says_why_an_operator_s_drain_included(teams, bob, alice, node, receiver,
                                                                     django_capture_on_commit_callbacks):
    """Operator trial 29: an operator's "drain and requeue" reached the team's channel as "t29-evac
    was preempted and requeued" — not who, not why, which the job's timeline said."""
    from apps.jobs.services import job_evacuate

    job = make_job(team=teams["vision"], user=bob, state="running", node=node, gpu_indices=[0],
                   started_at=timezone.now(), task_name="evacuated")
    channel_create(by=bob, name="hook", kind="webhook", target=receiver.url)
    preference_update(user=bob, on_preempted=True)
    with django_capture_on_commit_callbacks(execute=True):
        assert job_evacuate(job, node_name=node.name, reason="kernel upgrade", by=alice)
    run_notifications()
    [body] = [json.loads(r.body) for r in receiver.received]
    assert body["event"] == "preempted"
    assert body["message"] == (f"evacuated was preempted and requeued: node {node.name} is drained by alice "
                               "(kernel upgrade); resumes from its checkpoint")
    assert body["reason"] == f"node {node.name} is drained by alice (kernel upgrade); resumes from its checkpoint"
