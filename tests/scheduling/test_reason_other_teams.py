"""A waiting job's reason counts the jobs ahead of it that belong to other teams, which its own
team cannot see in its queue, without naming them (trial 14, F34)."""

from __future__ import annotations

import re

import pytest
from django.utils import timezone

from apps.jobs.models import Job
from apps.scheduling import policy
from apps.scheduling.inputs import cluster_state
from apps.scheduling.loop import plan_and_start, queue_update
from apps.scheduling.policy import plan
from tests.conftest import api_client

from .policy_helpers import HOUR, NOW, job, node, running, state
from .test_inputs import submit


def others_ahead(entries, teams: dict[str, str]) -> list[int]:
    return [sum(teams[e.job_id] != teams[entry.job_id] for e in entries[:i]) for i, entry in enumerate(entries)]


def test_the_reason_says_how_many_of_the_jobs_ahead_are_another_teams() -> None:
    cluster = [node("n1", gpus=2)]
    busy = [running("r", "n1", (0, 1), left_s=HOUR)]
    queue = [job("rob-high", team="robotics", user="cat", cls="high", age_s=60),
             job("vis-high", team="vision", user="ann", cls="high"),
             job("vis-medium", team="vision", user="ann", age_s=60),
             job("rob-medium", team="robotics", user="cat")]
    teams = {j.job_id: j.team for j in queue}
    entries = plan(state(cluster, queue, busy), NOW).queue
    counted = others_ahead(entries, teams)
    for entry, others in zip(entries, counted, strict=True):
        ahead = entry.position - 1
        if not ahead:
            assert not entry.reason.startswith("behind"), entry.reason
        elif not others:
            assert re.match(rf"behind {ahead} higher-priority jobs?; ", entry.reason), entry.reason
        else:
            words = "1 of another team" if others == 1 else f"{others} of other teams"
            assert entry.reason.startswith(f"behind {ahead} higher-priority job{'s' if ahead != 1 else ''} ({words});"), \
                entry.reason
    assert counted[1:] and any(counted) and 2 in counted  # the cases above did occur
    one_team = [job(f"j{i}", user=f"u{i}") for i in range(3)]  # a queue of one team says nothing of others
    assert plan(state(cluster, one_team, busy), NOW).queue[-1].reason.startswith(
        "behind 2 higher-priority jobs; waiting for")


@pytest.mark.django_db
def test_a_member_reads_the_count_of_the_jobs_ahead_they_cannot_see(alice, bob, carol, demo_registered, node):
    submit(bob, epochs=50, resources={"gpu": 2})  # takes node-a's two GPUs
    plan_and_start()
    theirs = submit(carol, resources={"gpu": 2}, priority="high")
    mine = submit(bob, resources={"gpu": 2})
    plan_and_start()
    queue = api_client(alice).get("/api/v1/queue/").json()["results"]
    assert [row["id"] for row in queue] == [str(mine.pk)]  # robotics' job is not listed
    assert queue[0]["reason"].startswith("behind 1 higher-priority job (1 of another team); waiting for")
    assert Job.objects.get(pk=theirs.pk).reason.startswith("waiting for")
    now = timezone.now()
    state_now, jobs_by_id = cluster_state(now)
    assert queue_update(policy.plan(state_now, now.timestamp()).queue, jobs_by_id, now) == 0  # no news: no write
