"""The usage page's charts in a real browser: the period report and the admins' cluster history."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.jobs.models import JobEvent
from apps.monitoring.models import UtilisationHour
from apps.quotas.models import TeamQuota, UsageRecord
from tests.conftest import make_user
from tests.jobs.factories import make_job

from .conftest import screenshot, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def usage_history(teams, users) -> None:
    now = timezone.now()
    plan = [("vision", "alice", 6.0, 4), ("vision", "bob", 9.5, 35), ("robotics", "carol", 3.0, 12),
            ("robotics", "dave", 12.0, 90), ("vision", "bob", 2.0, 8), ("robotics", "carol", 4.5, 20)]
    for n, (team, user, hours, waited) in enumerate(plan):
        end = now - timedelta(hours=6 * n + 1)
        job = make_job(team=teams[team], user=users[user], state="failed" if n == 3 else "succeeded",
                       finished_at=end, first_started_at=end - timedelta(hours=hours))
        job.created_at = end - timedelta(hours=hours, minutes=waited)
        job.save(update_fields=["created_at"])
        UsageRecord.objects.create(job=job, team=teams[team], user=users[user], attempt=1, priority_class="medium",
                                   gpu_seconds=hours * 3600, started_at=end - timedelta(hours=hours), ended_at=end)
        if n in (1, 3):
            JobEvent.objects.create(job=job, seq=1, attempt=1, kind="preempted" if n == 1 else "failed")
    TeamQuota.objects.create(team=teams["robotics"], user_gpu_hours_per_day=8)
    first = (now - timedelta(days=13)).replace(hour=0, minute=0, second=0, microsecond=0)
    for h in range(24 * 14):  # 14 whole days, the last one today
        load = 0.35 + 0.5 * ((h // 24) % 5) / 4
        UtilisationHour.objects.create(hour=first + timedelta(hours=h), samples=60, gpu_sum=60 * 16,
                                       allocated_gpu_sum=60 * 16 * load, utilisation_sum=60 * 16 * load * 0.8,
                                       running_jobs_sum=60 * 10 * load, queued_jobs_sum=60 * 6 * (1 - load))


def test_the_usage_page_draws_the_report_and_the_cluster_history(live_portal, page, alice, bob, carol, teams):
    _, web = live_portal
    dave = make_user("dave", teams["robotics"])
    alice.is_superuser = alice.is_staff = True
    alice.save(update_fields=["is_superuser", "is_staff"])
    usage_history(teams, {"alice": alice, "bob": bob, "carol": carol, "dave": dave})

    sign_in(page, web.url, "alice", "pw-alice")
    page.goto(f"{web.url}/usage/?group=user")
    page.wait_for_load_state("networkidle")
    drawn = page.evaluate("""() => ['report-hours', 'report-wait', 'cluster-chart', 'usage-chart'].map(
        id => { const c = Chart.getChart(id); return c ? c.data.datasets[0].data.length : -1; })""")
    assert drawn[0] == 4 and drawn[1] == 4 and drawn[2] == 14 and drawn[3] == 14, drawn
    assert page.inner_text("#usage-report tbody tr:first-child td:first-child") == "dave"  # most GPU-hours
    page.click("form.filters label:has(input[value=team])")
    page.click("form.filters button[type=submit]")
    page.wait_for_load_state("networkidle")
    assert page.inner_text("#usage-report").count("8 h / 24 h") == 1  # robotics' override, from the config
    screenshot(page, "17-usage-report")
    assert page.errors == []
