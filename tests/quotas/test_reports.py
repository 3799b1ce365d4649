"""Usage reports: numbers equal to the ledger, per team and per user, CSV, scope, the quota in force."""

from __future__ import annotations

import csv
import io
from datetime import timedelta

import pytest
from django.db.models import Sum
from django.test import Client
from django.utils import timezone

from apps.jobs.models import JobEvent
from apps.monitoring.services import cluster_history, utilisation_sample
from apps.quotas.models import TeamQuota, UsageRecord
from apps.scheduling.models import SchedulerConfig
from tests.conftest import api_client, make_user
from tests.jobs.factories import make_job

pytestmark = pytest.mark.django_db
DAY = timedelta(days=1)


@pytest.fixture
def history(teams, alice, bob, carol):
    """Three days of work: vision (alice, bob) and robotics (carol); one old record outside the period."""
    now = timezone.now()
    vision, robotics = teams["vision"], teams["robotics"]
    # "Today's" attempts end today even in the small hours (the tests select by end date).
    today_s = (now - now.astimezone(timezone.get_current_timezone()).replace(hour=0, minute=0, second=0,
                                                                               microsecond=0)).total_seconds()

    def job(team, user, state, waited_min, hours, ago):
        end = now - ago
        j = make_job(team=team, user=user, state=state, finished_at=end,
                     first_started_at=end - timedelta(hours=hours))
        j.created_at = end - timedelta(hours=hours, minutes=waited_min)
        j.save(update_fields=["created_at"])
        UsageRecord.objects.create(job=j, team=team, user=user, attempt=1, priority_class="medium",
                                   gpu_seconds=hours * 3600 * 2, started_at=end - timedelta(hours=hours), ended_at=end)
        return j

    jobs = [
        job(vision, bob, "succeeded", 10, 1.0, DAY),
        job(vision, bob, "failed", 30, 0.5, 2 * DAY),
        job(vision, alice, "succeeded", 2, 2.0, timedelta(seconds=min(3 * 3600, today_s / 3))),
        job(robotics, carol, "timed_out", 60, 3.0, timedelta(seconds=min(5 * 3600, today_s * 2 / 3))),
        job(vision, bob, "succeeded", 0, 4.0, 30 * DAY),  # outside a 7-day period
    ]
    JobEvent.objects.create(job=jobs[1], seq=1, attempt=1, kind="retry")
    JobEvent.objects.create(job=jobs[1], seq=2, attempt=2, kind="failed")
    JobEvent.objects.create(job=jobs[0], seq=1, attempt=1, kind="preempted")
    return jobs


def report(user, **params):
    response = api_client(user).get("/api/v1/usage/", params)
    assert response.status_code == 200, response.content
    return response.json()


def test_team_gpu_hours_equal_the_ledger(history, alice, teams):
    start = timezone.now() - 7 * DAY
    rows = {r["key"]: r for r in report(alice, group="team", **{"from": start.isoformat()})["rows"]}
    ledger = UsageRecord.objects.filter(team=teams["vision"], ended_at__gte=start).aggregate(s=Sum("gpu_seconds"))["s"]
    assert rows["vision"]["gpu_hours"] == pytest.approx(ledger / 3600, abs=1e-3) == pytest.approx(7.0, abs=1e-3)
    assert (rows["vision"]["jobs_succeeded"], rows["vision"]["jobs_failed"]) == (2, 1)
    assert (rows["vision"]["failures"], rows["vision"]["preemptions"]) == (2, 1)
    # waits 10, 30 and 2 minutes: mean 14 min, nearest-rank p95 = 30 min
    assert rows["vision"]["wait_mean_s"] == pytest.approx(14 * 60, abs=1)
    assert rows["vision"]["wait_p95_s"] == pytest.approx(30 * 60, abs=1)
    assert "robotics" not in rows  # alice is not in robotics


def test_per_user_rows_are_the_managers_team_and_only_their_own_for_members(history, alice, bob, teams):
    rows = {r["key"]: r for r in report(alice, group="user")["rows"]}
    assert set(rows) == {"alice", "bob"}
    assert rows["bob"]["gpu_hours"] == pytest.approx(3.0, abs=1e-3)  # 2 h + 1 h; the 30-day-old record is out
    assert rows["alice"]["gpu_hours"] == pytest.approx(4.0, abs=1e-3)
    assert {r["key"] for r in report(bob, group="user")["rows"]} == {"bob"}


def test_a_period_selects_by_end_of_attempt(history, alice):
    today = timezone.localdate()
    rows = {r["key"]: r for r in report(alice, group="team", **{"from": today.isoformat(),
                                                                "to": today.isoformat()})["rows"]}
    assert rows["vision"]["gpu_hours"] == pytest.approx(4.0, abs=1e-3)  # only alice's job ended today


def test_csv_export_has_one_row_per_team_with_the_same_numbers(history, alice):
    response = api_client(alice).get("/api/v1/usage/", {"group": "team", "format": "csv"})
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    assert "attachment" in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert [r["team"] for r in rows] == ["vision"]
    assert float(rows[0]["gpu_hours"]) == pytest.approx(7.0, abs=1e-3)
    assert rows[0]["jobs_succeeded"] == "2" and rows[0]["preemptions"] == "1"


def test_bad_parameters_name_the_field(alice):
    client = api_client(alice)
    for params, field in (({"group": "planet"}, "group"), ({"from": "yesterday"}, "from"),
                          ({"from": "2026-02-02", "to": "2026-01-01"}, "from"), ({"to": "31/01/2026"}, "to")):
        response = client.get("/api/v1/usage/", params)
        assert response.status_code == 400 and field in response.json(), (params, response.content)


def test_the_quota_shown_is_the_configuration_in_force(teams, alice, bob):
    SchedulerConfig.current()
    SchedulerConfig.objects.update(user_gpu_hours_per_day=12)
    assert report(bob)["me"]["quota_gpu_hours_24h"] == 12
    TeamQuota.objects.create(team=teams["vision"], user_gpu_hours_per_day=5)
    summary = report(bob)
    assert summary["me"]["quota_gpu_hours_24h"] == 5 and summary["teams"]["vision"]["my_quota_gpu_hours_24h"] == 5
    rows = {r["key"]: r for r in report(alice, group="team")["rows"]}
    assert rows["vision"]["quota_gpu_hours_per_user_day"] == 5
    page = Client()
    page.force_login(bob)
    html = page.get("/usage/").content.decode()
    assert "/ 5 h" in html and "20 h" not in html
    SchedulerConfig.objects.update(user_gpu_hours_per_day=None)
    TeamQuota.objects.all().delete()
    assert report(bob)["me"]["quota_gpu_hours_24h"] is None
    assert "no quota" in page.get("/usage/").content.decode()


def test_the_usage_page_shows_the_report_table(history, alice):
    page = Client()
    page.force_login(alice)
    html = page.get("/usage/", {"group": "user"}).content.decode()
    assert 'id="usage-report"' in html and "<td>bob</td>" in html and "carol" not in html
    assert 'id="report-hours"' in html and "format=csv" in html
    assert "cluster-chart" not in html  # the cluster history is for admins


def test_the_admin_usage_report_is_scoped(history, alice):
    alice.is_staff = True
    alice.save(update_fields=["is_staff"])
    page = Client()
    page.force_login(alice)
    response = page.get("/admin/quotas/usagereport/", {"group": "team"})
    assert response.status_code == 200
    html = response.content.decode()
    assert "<td>vision</td>" in html and "robotics" not in html


def test_both_report_pages_show_a_bad_period_beside_the_default_report(history, alice):
    """The pages never 400: an unknown group shows teams, a bad period the last 7 days and the error."""
    alice.is_staff = True
    alice.save(update_fields=["is_staff"])
    page = Client()
    page.force_login(alice)
    for url in ("/usage/", "/admin/quotas/usagereport/"):
        response = page.get(url, {"group": "nonsense", "from": "yesterday-ish"})
        assert response.status_code == 200, url
        html = response.content.decode()
        assert "is not an ISO date" in html and "<td>vision</td>" in html, url


def test_the_cluster_history_rolls_samples_into_hours_and_days(node, teams, bob):
    make_job(team=teams["vision"], user=bob, state="running", node=node, gpu_indices=[0], gpu_share=1.0)
    make_job(team=teams["vision"], user=bob)
    now = timezone.now()
    utilisation_sample(now)
    hour = utilisation_sample(now)
    assert hour.samples == 2 and hour.allocation == pytest.approx(0.5)  # 1 of node-a's 2 GPUs
    assert hour.mean("queued_jobs_sum") == 1
    day = cluster_history(days=2, now=now)
    assert day["allocation"] == [0.5] and day["queued"] == [1.0]
    admin = make_user("root", None)
    admin.is_superuser = admin.is_staff = True
    admin.save()
    page = Client()
    page.force_login(admin)
    assert "cluster-chart" in page.get("/usage/").content.decode()


@pytest.mark.parametrize(("params", "field"), [
    ({"to": "9999-12-31"}, "to"),  # a manager's "up to forever": the day after left the calendar (a 500)
    ({"from": "2026-12-01", "to": "9999-12-31"}, "to"),
    ({"to": "0001-01-01"}, "to"),  # the default week before it left it too
    ({"from": "0001-01-01", "to": "2026-01-05"}, "from"),
    ({"to": "9999-12-31T23:59:59"}, "to"),
])
def test_dates_out_of_the_calendar_name_the_field_on_the_api_and_both_pages(params, field, history, alice):
    response = api_client(alice).get("/api/v1/usage/", params)
    assert response.status_code == 400, response.content
    assert "out of range" in response.json()[field][0]
    alice.is_staff = True
    alice.save(update_fields=["is_staff"])
    page = Client()
    page.force_login(alice)
    for url in ("/usage/", "/admin/quotas/usagereport/"):
        response = page.get(url, params)
        assert response.status_code == 200, url
        assert "out of range" in response.content.decode() and "<td>vision</td>" in response.content.decode(), url


@pytest.mark.parametrize(("params", "field", "given"), [
    ({"to": "0001-01-01"}, "to", "'0001-01-01'"),  # said "0001-01-02 is out of range": the day after, not sent
    ({"from": "1969-12-31", "to": "1970-01-05"}, "from", "'1969-12-31'"),
    ({"to": "9001-01-01T00:00:00"}, "to", "'9001-01-01T00:00:00'"),
])
def test_a_date_out_of_range_is_quoted_as_given_with_the_allowed_range(params, field, given, alice):
    """The message names what the user sent and the dates allowed (new-user trial 28)."""
    response = api_client(alice).get("/api/v1/usage/", params)
    assert response.status_code == 400, response.content
    assert response.json() == {field: [f"{given} is out of range: give a date from 1970-01-01 to 9000-12-31"]}


def test_the_last_day_allowed_is_taken_though_its_end_is_the_next_year(alice):
    """``to=9000-12-31`` (inclusive) ends at 9001-01-01 00:00: the range check looked at that."""
    response = api_client(alice).get("/api/v1/usage/", {"from": "9000-12-01", "to": "9000-12-31"})
    assert response.status_code == 200, response.content


def test_a_small_quota_is_shown_with_its_digits(teams, bob):
    TeamQuota.objects.create(team=teams["vision"], user_gpu_hours_per_day=0.02)
    page = Client()
    page.force_login(bob)
    html = page.get("/usage/").content.decode()
    assert "/ 0.02 h" in html and "0.02 h / 24 h" in html and "/ 0.0 h" not in html  # was "0.0 h" (manager trial)


def test_a_deleted_job_leaves_its_gpu_hours_in_the_ledger(history, alice, superuser):
    """A superuser's delete of a finished job took its usage with it: the team's GPU-hours and the
    charged total went down (manager trial). The ledger keeps team, user and GPU-seconds."""
    from tests.conftest import admin_client

    before = report(alice, group="team")["rows"]
    charged = UsageRecord.objects.aggregate(s=Sum("gpu_seconds"))["s"]
    response = admin_client(superuser).post(f"/admin/jobs/job/{history[0].pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert UsageRecord.objects.aggregate(s=Sum("gpu_seconds"))["s"] == charged
    assert UsageRecord.objects.filter(job=None, team__slug="vision", user__username="bob").count() == 1
    after = report(alice, group="team")["rows"]
    assert [r["gpu_hours"] for r in after] == [r["gpu_hours"] for r in before]


def test_a_user_in_two_teams_has_a_row_per_team_with_that_teams_quota(history, teams, carol):
    """Per-user rows are per (team, user): which team was charged, and the quota in force there (trial 14, F12)."""
    SchedulerConfig.current()
    SchedulerConfig.objects.update(user_gpu_hours_per_day=12)
    TeamQuota.objects.create(team=teams["vision"], user_gpu_hours_per_day=0.02)
    make_user("carol", teams["vision"])
    end = timezone.now() - timedelta(hours=1)
    job = make_job(team=teams["vision"], user=carol, state="succeeded", finished_at=end, first_started_at=end)
    UsageRecord.objects.create(job=job, team=teams["vision"], user=carol, attempt=1, priority_class="medium",
                               gpu_seconds=3600, started_at=end - timedelta(hours=1), ended_at=end)
    body = report(carol, group="user")
    rows = {(r["team"], r["key"]): r for r in body["rows"]}
    assert set(rows) == {("robotics", "carol"), ("vision", "carol")}
    assert rows[("robotics", "carol")]["gpu_hours"] == pytest.approx(6.0, abs=1e-3)
    assert rows[("vision", "carol")]["gpu_hours"] == pytest.approx(1.0, abs=1e-3)
    assert rows[("vision", "carol")]["quota_gpu_hours_per_user_day"] == 0.02
    assert rows[("robotics", "carol")]["quota_gpu_hours_per_user_day"] == 12
    assert list(body["rows"][0])[:2] == ["key", "team"]
    assert {r["key"] for r in report(carol, group="team")["rows"]} == {"robotics", "vision"}  # teams: unchanged
    assert "team" not in report(carol, group="team")["rows"][0]


def test_the_csv_per_user_has_the_team_and_its_quota(history, teams, alice):
    TeamQuota.objects.create(team=teams["vision"], user_gpu_hours_per_day=5)
    response = api_client(alice).get("/api/v1/usage/", {"group": "user", "format": "csv"})
    assert response.status_code == 200
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert list(rows[0])[:3] == ["user", "team", "gpu_hours"]
    assert {(r["user"], r["team"], r["quota_gpu_hours_per_user_day"]) for r in rows} == {
        ("alice", "vision", "5.0"), ("bob", "vision", "5.0")}


def test_both_report_pages_show_the_team_and_quota_of_a_users_row(history, teams, alice):
    TeamQuota.objects.create(team=teams["vision"], user_gpu_hours_per_day=5)
    alice.is_staff = True
    alice.save(update_fields=["is_staff"])
    page = Client()
    page.force_login(alice)
    html = page.get("/usage/", {"group": "user"}).content.decode()
    assert "<th>Team</th>" in html and "<td>bob</td><td>vision</td>" in html and "5 h / 24 h" in html
    html = page.get("/admin/quotas/usagereport/", {"group": "user"}).content.decode()
    assert "<th>team</th>" in html and "<td>bob</td><td>vision</td>" in html and "<td>5.0</td>" in html


def test_a_small_use_reads_the_same_on_the_usage_and_teams_pages(teams, bob):
    """Bob's 0.003 GPU-h read "0.00 / 0.02 h" on the usage page and "0.003 h" on the Teams page (manager trial 15, F21)."""
    TeamQuota.objects.create(team=teams["vision"], user_gpu_hours_per_day=0.02)
    end = timezone.now() - timedelta(minutes=5)
    job = make_job(team=teams["vision"], user=bob, state="succeeded", finished_at=end)
    UsageRecord.objects.create(job=job, team=teams["vision"], user=bob, attempt=1, priority_class="medium",
                               gpu_seconds=0.003 * 3600, started_at=end - timedelta(seconds=11), ended_at=end)
    page = Client()
    page.force_login(bob)
    usage = page.get("/usage/").content.decode()
    assert "0.003<small> / 0.02 h" in usage and "0.017<small> h" in usage  # used, quota and what is left
    assert "0.00<" not in usage
    assert "you: 0.003 h" in page.get("/teams/").content.decode()
