"""The scheduler's leader lease (Redis, compare-and-renew) and its fencing token (database)."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest
from django.conf import settings
from django.utils import timezone

from apps.core import redis_outage
from apps.core.redis_client import redis_client
from apps.core.redis_outage import redis_reachable, redis_unreachable
from apps.jobs.models import GpuSlot, Job, JobState
from apps.scheduling.leader import LEASE_KEY, LeaderLease, LeadershipLost, fenced
from apps.scheduling.loop import plan_and_start
from tests.jobs.factories import make_job

pytestmark = pytest.mark.django_db


def expire(lease: LeaderLease) -> None:
    """What a long pause does: the lease runs out in Redis while its holder still thinks it leads."""
    redis_client().delete(LEASE_KEY)


def test_one_scheduler_leads_and_each_tenure_gets_a_larger_token():
    a, b = LeaderLease("a", ttl_s=10), LeaderLease("b", ttl_s=10)
    assert a.hold() and not b.hold()
    assert a.hold(), "renewal"
    first = a.token
    a.release()
    assert b.hold() and b.token > first


def test_an_expired_holder_never_renews_the_next_leaders_lease():
    a, b = LeaderLease("a", ttl_s=10), LeaderLease("b", ttl_s=30)
    assert a.hold()
    expire(a)
    assert b.hold()
    assert not a.hold()
    assert b.current_holder().startswith("b#")
    assert redis_client().pttl(LEASE_KEY) > 15_000, "a's renewal did not shorten b's lease to a's ttl"


def test_a_stale_leader_cannot_claim_after_a_newer_one_took_over(alice, teams, node):
    job = make_job(team=teams["vision"], user=alice)
    old, new = LeaderLease("old", ttl_s=10), LeaderLease("new", ttl_s=10)
    assert old.hold()
    expire(old)
    assert new.hold()
    with pytest.raises(LeadershipLost):
        plan_and_start(token=old.token)
    assert Job.objects.get(pk=job.pk).state == JobState.QUEUED and not GpuSlot.objects.exists()
    assert plan_and_start(token=new.token)
    assert Job.objects.get(pk=job.pk).state == JobState.STARTING


def test_the_fence_holds_only_for_the_newest_token():
    lease = LeaderLease("a", ttl_s=10)
    assert lease.hold()
    with fenced(lease.token):
        pass
    with pytest.raises(LeadershipLost), fenced(lease.token - 1):
        pass


@pytest.mark.django_db(transaction=True)
def test_once_runs_a_pass_only_with_the_lease(alice, teams, node):
    from yoloportal.env import database_url

    job = make_job(team=teams["vision"], user=alice)
    # The node fixture heartbeated once, at its creation; two manage.py starts on a loaded machine
    # can take longer than the default suspicion (15 s) or grace (30 s), and a suspected node gets
    # no work. This test is about the lease: the node counts as alive however slow the start.
    env = {"PATH": "/usr/bin:/bin", "DATABASE_URL": database_url(settings.DATABASES["default"]),
           "REDIS_URL": settings.REDIS_URL, "DATA_DIR": str(settings.DATA_DIR), "LOG_LEVEL": "WARNING",
           "NODE_GRACE_S": "3600", "NODE_SUSPECT_S": "3600"}

    def once() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "manage.py", "scheduler", "--once"], cwd=settings.BASE_DIR,
                              env=env, capture_output=True, text=True, timeout=120)

    # Its lease must outlive the refused run's interpreter start (over 60 s at load ~25 once:
    # the lease expired, --once took it and ran the pass).
    other = LeaderLease("other", ttl_s=600)
    assert other.hold()
    refused = once()
    assert refused.returncode == 3 and "another scheduler leads" in refused.stderr
    assert Job.objects.get(pk=job.pk).state == JobState.QUEUED
    other.release()
    # The node must still look alive: a node silent for NODE_SUSPECT_S gets no new work, and
    # the refused run's interpreter start can take that long on a loaded machine.
    type(node).objects.filter(pk=node.pk).update(last_heartbeat=timezone.now())
    done = once()
    assert done.returncode == 0, done.stderr
    assert Job.objects.get(pk=job.pk).state == JobState.STARTING
    assert not redis_client().exists(LEASE_KEY), "--once gives the lease back"


def test_a_standby_says_once_whose_lease_it_waits_on_and_when_it_takes_over(caplog):
    a, b = LeaderLease("host-a:1", ttl_s=10), LeaderLease("host-b:2", ttl_s=10)
    assert a.hold()
    with caplog.at_level("INFO", logger="apps.scheduling.leader"):
        caplog.clear()
        assert not b.hold() and not b.hold() and not b.hold()
        a.release()
        assert b.hold()
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["another scheduler (host-a:1) holds the leader lease; standing by",
                        f"scheduler host-b:2 leads with fencing token {b.token}, taking over from host-a:1"]


@pytest.fixture
def no_outage_seen(monkeypatch):
    """This process has seen no Redis outage (the module keeps what it saw per process)."""
    monkeypatch.setattr(redis_outage, "_down_since", None)
    monkeypatch.setattr(redis_outage, "_back_at", None)


def test_a_lease_that_lapsed_in_a_redis_outage_is_said_so_and_taken_again(caplog, no_outage_seen):
    """What a Redis outage longer than the lease does to the leader: no "lost the lease" alarm
    (its outage WARNING said the lease would lapse), the fact and a new tenure."""
    lease = LeaderLease("host-a:1", ttl_s=0.2)
    assert lease.hold()
    first = lease.token
    redis_unreachable(ConnectionError("test: Redis away"))
    time.sleep(0.3)
    with caplog.at_level("INFO", logger="apps.scheduling.leader"):
        redis_reachable()
        caplog.clear()
        assert lease.hold()
    logged = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in logged] == ["INFO", "INFO"], logged
    assert re.fullmatch(rf"scheduler host-a:1's leader lease \(token {first}\) lapsed: not renewed for "
                        r"\d+\.\d s \(it lasts 0\.2 s\)", logged[0][1]), logged
    assert logged[1][1] == f"scheduler host-a:1 leads with fencing token {lease.token}"
    assert lease.token > first


def test_a_lease_that_lapsed_with_redis_there_is_a_warning_that_the_scheduler_stalled(caplog, no_outage_seen):
    """No outage explains it: the process itself did not renew in time (a long pass, a stuck
    database), and another scheduler may have led meanwhile: an operator should hear of it."""
    lease = LeaderLease("host-a:1", ttl_s=0.2)
    assert lease.hold()
    first = lease.token
    time.sleep(0.3)
    with caplog.at_level("INFO", logger="apps.scheduling.leader"):
        caplog.clear()
        assert lease.hold()
    logged = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in logged] == ["WARNING", "INFO"], logged
    assert re.fullmatch(rf"scheduler host-a:1's leader lease \(token {first}\) lapsed: this process did not "
                        r"renew it for \d+\.\d s \(it lasts 0\.2 s\) though Redis was reachable; it stalled",
                        logged[0][1]), logged
    assert lease.token > first
