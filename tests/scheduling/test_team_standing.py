"""A team's limits in force and its fair-share standing, for its members (trial 14, F33/F36):
API ``teams/`` and the portal's Teams page, computed by the scheduler's own functions."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from apps.jobs.models import JobState
from apps.quotas.models import TeamQuota, UsageRecord
from apps.scheduling.inputs import cluster_state
from apps.scheduling.policy.priority import fairshare_factors
from tests.conftest import api_client
from tests.jobs.factories import make_job

pytestmark = pytest.mark.django_db


def charge(team, user, *, gpu_hours: float, hours_ago: float = 1.0, priority_class: str = "medium"):
    ended = timezone.now() - timedelta(hours=hours_ago)
    job = make_job(team=team, user=user, state=JobState.SUCCEEDED)
    return UsageRecord.objects.create(job=job, team=team, user=user, attempt=1, priority_class=priority_class,
                                      gpu_seconds=gpu_hours * 3600, started_at=ended - timedelta(hours=gpu_hours),
                                      ended_at=ended)


def test_each_limit_is_shown_with_its_value_and_where_it_comes_from(bob, teams):
    TeamQuota.objects.create(team=teams["vision"], max_gpus=4, urgent_gpu_hours_per_day=3)
    body = api_client(bob).get(f"/api/v1/teams/{teams['vision'].pk}/").json()
    limits = body["limits"]
    assert limits["max_gpus"] == {"value": 4.0, "source": "team", "in_use": 0}
    assert limits["urgent_gpu_hours_per_day"] == {"value": 3.0, "source": "team", "used_24h": 0.0}
    assert limits["urgent_max_gpus"] == {"value": 2.0, "source": "site default", "in_use": 0}
    assert limits["user_gpu_hours_per_day"] == {"value": 20.0, "source": "site default", "my_used_24h": 0.0}
    assert limits["max_gpus_per_job"] == {"value": None, "source": "site default"}
    assert body["team"] == "vision" and body["role"] == "member"
    # Who may spend the urgent allowance, and whether fair share orders the queue at all (trial 15, F4, F29).
    assert (body["urgent_by"], body["policy"]) == ("members", "fair")


def test_the_urgent_allowance_and_the_teams_gpus_show_what_is_used(bob, alice, teams, node):
    charge(teams["vision"], alice, gpu_hours=1.5, priority_class="urgent")
    charge(teams["vision"], alice, gpu_hours=4, priority_class="high")  # not urgent: not counted
    make_job(team=teams["vision"], user=bob, state=JobState.RUNNING, node=node, gpus=2,
             priority_class="urgent", run_class="urgent", started_at=timezone.now() - timedelta(minutes=30))
    limits = api_client(bob).get(f"/api/v1/teams/{teams['vision'].pk}/").json()["limits"]
    assert limits["urgent_gpu_hours_per_day"]["used_24h"] == pytest.approx(2.5, abs=0.01)  # 1.5 h + 2 GPUs × 0.5 h
    assert limits["urgent_max_gpus"]["in_use"] == 2
    assert limits["max_gpus"]["in_use"] == 2
    assert limits["user_gpu_hours_per_day"]["my_used_24h"] == pytest.approx(1.0, abs=0.01)


def test_the_fair_share_standing_is_the_schedulers_own(alice, bob, carol, teams):
    """Shares, decayed usage and each member's factor as the scheduler's pass computes them."""
    teams["robotics"].shares = 3
    teams["robotics"].save()
    charge(teams["vision"], alice, gpu_hours=3)
    charge(teams["robotics"], carol, gpu_hours=1)
    make_job(team=teams["vision"], user=bob)  # queued: ranked too
    fair = api_client(bob).get(f"/api/v1/teams/{teams['vision'].pk}/").json()["fair_share"]
    assert fair["shares"] == 1 and fair["total_shares"] == 4 and fair["share_fraction"] == 0.25
    assert fair["usage_fraction"] == pytest.approx(0.75, abs=1e-3)
    assert fair["decayed_gpu_hours"] < 3 and fair["total_decayed_gpu_hours"] < 4  # decayed, not raw
    assert fair["level"] == pytest.approx(0.25 / 0.75, abs=1e-3)
    assert fair["standing"].startswith("over-served")
    scheduler = fairshare_factors(cluster_state()[0])
    assert {m["user"]: m["factor"] for m in fair["members"]} == {
        "alice": round(scheduler[("vision", "alice")], 4), "bob": round(scheduler[("vision", "bob")], 4)}
    assert fair["my_factor"] == round(scheduler[("vision", "bob")], 4) and not fair["my_factor_if_submitted"]


def test_a_team_with_no_usage_is_ahead_and_a_member_sees_what_a_job_would_get(alice, carol, teams):
    charge(teams["robotics"], carol, gpu_hours=1)
    fair = api_client(alice).get(f"/api/v1/teams/{teams['vision'].pk}/").json()["fair_share"]
    assert fair["level"] is None and fair["standing"].startswith("no decayed usage")
    assert fair["my_factor"] == 1.0 and fair["my_factor_if_submitted"]


def test_another_teams_id_is_the_same_404_as_one_that_does_not_exist(carol, teams):
    client = api_client(carol)
    other = client.get(f"/api/v1/teams/{teams['vision'].pk}/")
    missing = client.get("/api/v1/teams/999999/")
    assert other.status_code == missing.status_code == 404
    assert other.json() == missing.json() == {"detail": "No team with that id in your teams."}
    assert [t["team"] for t in client.get("/api/v1/teams/").json()["results"]] == ["robotics"]


def test_the_teams_page_shows_limits_sources_and_standing(bob, teams):
    TeamQuota.objects.create(team=teams["vision"], max_gpus=4)
    client = Client()
    client.force_login(bob)
    html = client.get("/teams/").content.decode()
    section = html.split('data-team="vision"', 1)[1]
    assert 'data-limit="max_gpus"><td>GPUs the team may hold at once</td><td>4</td><td class="source">team' in section
    assert 'data-limit="urgent_max_gpus"' in section and "site default" in section
    assert "Fair share" in section and "1 of 1" in section
    assert "Who may submit urgent jobs</td><td>every member" in section and 'data-field="fifo"' not in section
    assert client.get(f"/teams/{teams['vision'].pk}/").status_code == 200
    assert client.get(f"/teams/{teams['robotics'].pk}/").status_code == 404
    from apps.accounts.models import Team
    from apps.scheduling.models import SchedulerConfig

    Team.objects.filter(slug="vision").update(urgent_by="managers")
    config = SchedulerConfig.current()
    config.policy = "fifo"
    config.save()
    section = client.get("/teams/").content.decode().split('data-team="vision"', 1)[1]
    assert "Who may submit urgent jobs</td><td>the team's managers only" in section
    assert "fair share does not order the queue" in section


def test_the_storage_quota_is_shown_with_what_the_team_keeps(bob, teams, settings):
    """A team that hit its storage quota could read its size and use only in the refusal: teams/
    and the Teams page listed every scheduler limit but not the uploads' quota (team adoption trial 30)."""
    from apps.accounts.models import StorageCharge

    settings.TEAM_STORAGE_QUOTA_GB = 100
    StorageCharge.objects.create(team=teams["vision"], key="datasets/vision/pcb/v1", bytes=3 * 1024**3 // 2)
    limits = api_client(bob).get(f"/api/v1/teams/{teams['vision'].pk}/").json()["limits"]
    assert limits["storage_gb"] == {"value": 100.0, "source": "site default", "used": 1.5,
                                    "used_bytes": 3 * 1024**3 // 2, "limit_bytes": 100 * 1024**3}
    teams["vision"].storage_quota_gb = 2
    teams["vision"].save()
    listed = api_client(bob).get("/api/v1/teams/").json()["results"]
    assert [t["limits"]["storage_gb"] for t in listed] == [
        {"value": 2.0, "source": "team", "used": 1.5, "used_bytes": 3 * 1024**3 // 2, "limit_bytes": 2 * 1024**3}]
    client = Client()
    client.force_login(bob)
    section = client.get("/teams/").content.decode().split('data-team="vision"', 1)[1]
    assert ('data-limit="storage_gb"><td>Uploaded datasets and weights</td><td>2.0\xa0GB</td><td class="source">team'
            '</td><td>1.5\xa0GB kept</td>') in section


def test_a_member_reads_only_their_own_teams_storage_use(bob, carol, teams, settings):
    """review30: the storage use teams/ gives is the team's own: another team's uploads neither add
    to it nor show, in the list, the team's page or the Teams page."""
    from apps.accounts.models import StorageCharge

    settings.TEAM_STORAGE_QUOTA_GB = 100
    StorageCharge.objects.create(team=teams["vision"], key="datasets/vision/pcb/v1", bytes=1024**3)
    StorageCharge.objects.create(team=teams["robotics"], key="datasets/robotics/arm/v1", bytes=7 * 1024**3)
    listed = api_client(bob).get("/api/v1/teams/").json()["results"]
    assert [(t["team"], t["limits"]["storage_gb"]["used_bytes"]) for t in listed] == [("vision", 1024**3)]
    assert api_client(bob).get(f"/api/v1/teams/{teams['robotics'].pk}/").status_code == 404
    assert api_client(carol).get(f"/api/v1/teams/{teams['robotics'].pk}/").json()["limits"]["storage_gb"][
        "used_bytes"] == 7 * 1024**3
    client = Client()
    client.force_login(bob)
    page = client.get("/teams/").content.decode()
    assert "1.0\xa0GB kept" in page and "7.0\xa0GB" not in page and 'data-team="robotics"' not in page
