"""Scenario tests for the fair policy: one behaviour each, readable as prose."""

from __future__ import annotations

import pytest

from apps.scheduling.policy import (
    DecayedUsage,
    JobRequest,
    PolicyConfig,
    RollingUsage,
    TeamPolicy,
    admission_error,
    fits_empty_cluster,
    plan,
)
from apps.scheduling.policy.priority import fair_tree

from .counterexamples import two_reservations_for_one_free_gpu
from .policy_helpers import HOUR, NOW, fair, job, node, running, state


def started(result) -> list[str]:
    return [s.job_id for s in result.starts]


def test_light_user_beats_heavy_user() -> None:
    """With one GPU free, the user with less decayed usage starts first."""
    cluster = [node("n1", gpus=1)]
    queue = [job("heavy-job", user="hugo", age_s=600), job("light-job", user="lena")]
    usage = {("vision", "hugo"): 500 * HOUR, ("vision", "lena"): 2 * HOUR}
    result = plan(state(cluster, queue, usage=usage), NOW)
    assert started(result) == ["light-job"]
    assert result.queue[0].job_id == "heavy-job"
    assert result.queue[0].factors["fairshare"] < 1.0


def test_under_served_team_outranks_every_user_of_an_over_served_team() -> None:
    usage = {("big", "b1"): 1000.0, ("big", "b2"): 1.0, ("small", "s1"): 10.0}
    factors = fair_tree(usage.keys(), usage, {}, TeamPolicy())
    assert factors[("small", "s1")] > factors[("big", "b2")] > factors[("big", "b1")]


def test_urgent_jumps_the_queue() -> None:
    cluster = [node("n1", gpus=1)]
    queue = [job("old-high", cls="high", age_s=3 * 86400), job("urgent", cls="urgent", team="safety")]
    assert started(plan(state(cluster, queue), NOW)) == ["urgent"]


def test_urgent_beyond_concurrent_allowance_runs_as_high() -> None:
    """A team allowed 2 urgent GPUs gets the third urgent GPU only as a high job."""
    cluster = [node("n1", gpus=8)]
    teams = {"safety": TeamPolicy(urgent_max_gpus=2, urgent_gpu_hours_per_day=100)}
    queue = [job(f"u{i}", cls="urgent", team="safety", user=f"s{i}") for i in range(3)]
    result = plan(state(cluster, queue, teams=teams), NOW)
    classes = sorted(s.priority_class for s in result.starts)
    assert classes == ["high", "urgent", "urgent"]


def test_urgent_beyond_daily_allowance_is_demoted_with_a_reason() -> None:
    cluster = [node("n1", gpus=1)]
    teams = {"safety": TeamPolicy(urgent_gpu_hours_per_day=4)}
    busy = [running("r", "n1", (0,))]
    queue = [job("u", cls="urgent", team="safety")]
    result = plan(state(cluster, queue, busy, teams=teams, team_urgent_usage_24h={"safety": 3.5 * HOUR}), NOW)
    assert result.queue[0].factors["class"] < 1.0
    assert "urgent allowance used up" in result.queue[0].reason


def test_an_urgent_job_that_still_waits_says_when_it_may_preempt() -> None:
    """A new user saw an urgent job wait behind a low one with only "reserved" as the reason:
    the victim had not run the minimum yet. Said only where preemption is on."""
    cluster = [node("n1", gpus=1)]
    busy = [running("r", "n1", (0,), ran_s=60.0, preemptible=True, cls="low")]
    queue = [job("u", cls="urgent")]
    result = plan(state(cluster, queue, busy), NOW)
    assert not result.starts and not result.preemptions
    assert "(urgent: preempts a lower-class job once it has run 10 min and has a checkpoint)" in result.queue[0].reason
    off = plan(state(cluster, queue, busy, config=PolicyConfig(preemption=False)), NOW)
    assert "urgent: preempts" not in off.queue[0].reason


@pytest.mark.parametrize("size_preemption", [False, True])
def test_a_preempted_job_learns_another_teams_job_only_as_such(size_preemption) -> None:
    """The victim's reason is its team's to read: the preemptor by id within the team, else only
    as "a job of another team" (a manager trial saw another team's job id in it)."""
    config = fair(size_preemption=size_preemption)
    for team, words in (("safety", "preempted by an urgent job of another team;"),
                        ("vision", "preempted by urgent job u;")):
        cluster = [node("n1", gpus=1)]
        busy = [running("r", "n1", (0,), ran_s=2 * HOUR, preemptible=True, cls="low", team="vision")]
        result = plan(state(cluster, [job("u", cls="urgent", team=team)], busy, config=config), NOW)
        (preemption,) = result.preemptions
        assert preemption.reason.startswith(words), preemption.reason
        assert ("job u" in preemption.reason) == (team == "vision")
    # Size-aware preemption of a long job by a short one of another team says so too.
    busy = [running("long", "n1", (0,), cls="low", ran_s=HOUR, left_s=20 * HOUR, preemptible=True)]
    result = plan(state([node("n1", gpus=1)], [job("short", cls="low", walltime_s=600, team="safety")], busy,
                        config=fair(size_preemption=True)), NOW)
    (preemption,) = result.preemptions
    assert preemption.reason.startswith("preempted by a job of another team, which needs far less GPU time")


def test_backfill_starts_a_short_job_that_ends_before_the_reservation() -> None:
    """4 GPUs free now, all 8 at +2 h: a 1-h job backfills; a 3-h one would delay the 8-GPU job."""
    cluster = [node("n1", gpus=8)]
    busy = [running("r", "n1", (4, 5, 6, 7), left_s=2 * HOUR)]
    queue = [
        job("big", gpus=8, age_s=86400, cls="high"),
        job("short", gpus=2, walltime_s=HOUR, cls="low"),
        job("long", gpus=2, walltime_s=3 * HOUR, cls="low", user="zed"),
    ]
    result = plan(state(cluster, queue, busy), NOW)
    assert started(result) == ["short"]
    big = next(e for e in result.queue if e.job_id == "big")
    assert big.reserved_node == "n1"
    assert big.reserved_at == pytest.approx(NOW + 2 * HOUR, abs=1)
    assert big.estimated_start_low <= NOW + 2 * HOUR <= big.estimated_start_high


def test_backfill_may_use_gpus_the_reserved_job_does_not_need() -> None:
    """The 6-GPU job is reserved at +2 h; a long 2-GPU job fits beside it and starts now."""
    cluster = [node("n1", gpus=8)]
    busy = [running("r", "n1", (4, 5, 6, 7), left_s=2 * HOUR)]
    queue = [job("big", gpus=6, age_s=86400, cls="high"), job("long", gpus=2, walltime_s=9 * HOUR, cls="low")]
    result = plan(state(cluster, queue, busy), NOW)
    assert started(result) == ["long"]
    assert result.queue[0].reserved_at == pytest.approx(NOW + 2 * HOUR, abs=1)


def test_backfill_respects_all_reservations_on_a_node_together() -> None:
    """Each reservation alone still fits beside the sliver; together they need both whole GPUs."""
    result = plan(two_reservations_for_one_free_gpu(), NOW)
    assert started(result) == []
    reserved = {e.job_id: e.reserved_at for e in result.queue if e.reserved_node}
    assert reserved == {"first": pytest.approx(NOW + HOUR, abs=1), "second": pytest.approx(NOW + HOUR, abs=1)}


def test_user_quota_is_a_budget_of_gpu_hours_already_used() -> None:
    """Under the daily quota a user starts jobs, however long; at the quota, only as over-quota work."""
    cluster = [node("n1", gpus=1)]
    config = fair(user_gpu_hours_per_day=20)
    three_days = job("three-days", gpus=1, walltime_s=72 * HOUR)
    under = plan(state(cluster, [three_days], config=config, user_usage_24h={"ann": 19 * HOUR}), NOW)
    assert started(under) == ["three-days"]
    others = job("colleague", user="bob")
    over = plan(state(cluster, [three_days, others], config=config, user_usage_24h={"ann": 20 * HOUR}), NOW)
    assert started(over) == ["colleague"]
    assert over.queue[0].reason.startswith("over quota: runs when GPUs are idle, may be preempted (20 of 20 ")
    # A small quota's figures keep their digits: "0.0 of 0.02" was said of a user over it (manager trial).
    small = plan(state(cluster, [three_days, others], config=fair(user_gpu_hours_per_day=0.02),
                       user_usage_24h={"ann": 0.0317 * HOUR}), NOW)
    assert "(0.032 of 0.02 GPU-hours used in 24 h" in small.queue[0].reason


def test_over_quota_work_starts_on_idle_gpus_and_is_preempted_first() -> None:
    """Past the quota a user's job still runs on GPUs nobody wants; a colleague's job takes them back."""
    cluster = [node("n1", gpus=1)]
    config = fair(user_gpu_hours_per_day=20)
    usage = {"ann": 20 * HOUR}
    alone = plan(state(cluster, [job("ann-job")], config=config, user_usage_24h=usage), NOW)
    assert started(alone) == ["ann-job"]
    busy = [running("ann-job", "n1", (0,), user="ann", ran_s=60, left_s=10 * HOUR, preemptible=True)]
    later = plan(state(cluster, [job("bob-job", user="bob")], busy, config=config, user_usage_24h=usage), NOW)
    assert started(later) == ["bob-job"]
    assert [p.job_id for p in later.preemptions] == ["ann-job"]
    assert "over the daily GPU-hour quota" in later.preemptions[0].reason


def test_a_job_that_may_not_be_preempted_must_fit_in_the_quota() -> None:
    """``preemptible: false`` cannot run as over-quota work: it starts only within what is left."""
    cluster = [node("n1", gpus=8)]
    config = fair(user_gpu_hours_per_day=20)
    fixed = job("fixed", walltime_s=6 * HOUR, preemptible=False)
    fits = plan(state(cluster, [fixed], config=config, user_usage_24h={"ann": 10 * HOUR}), NOW)
    assert started(fits) == ["fixed"]
    too_long = plan(state(cluster, [fixed], config=config, user_usage_24h={"ann": 15 * HOUR}), NOW)
    assert started(too_long) == []
    assert "may not be preempted" in too_long.queue[0].reason


def test_fractional_jobs_share_a_gpu() -> None:
    cluster = [node("n1", gpus=2)]
    queue = [job(f"half{i}", gpus=0.5, user=f"u{i}") for i in range(4)]
    result = plan(state(cluster, queue), NOW)
    gpus_used = {(s.node, s.gpu_indices) for s in result.starts}
    assert len(result.starts) == 4
    assert len(gpus_used) == 2
    assert all(s.gpu_share == 0.5 for s in result.starts)


def test_fractional_jobs_respect_gpu_memory() -> None:
    """Two 0.25 jobs asking 30 GB each cannot share one 40 GB GPU."""
    cluster = [node("n1", gpus=1, gpu_mb=40000)]
    queue = [job(f"q{i}", gpus=0.25, gpu_memory_mb=30000, user=f"u{i}") for i in range(2)]
    assert len(plan(state(cluster, queue), NOW).starts) == 1


def test_preemption_picks_fewest_lowest_most_recent_victims() -> None:
    cluster = [node("n1", gpus=2), node("n2", gpus=2)]
    busy = [
        running("n1-medium", "n1", (0, 1), cls="medium", ran_s=2 * HOUR, preemptible=True),
        running("n2-low-old", "n2", (0,), cls="low", ran_s=5 * HOUR, preemptible=True),
        running("n2-low-new", "n2", (1,), cls="low", ran_s=1 * HOUR, preemptible=True),
    ]
    queue = [job("urgent", gpus=1, cls="urgent", team="safety")]
    result = plan(state(cluster, queue, busy), NOW)
    assert [p.job_id for p in result.preemptions] == ["n2-low-new"]
    assert result.starts[0].node == "n2" and result.starts[0].priority_class == "urgent"


def test_preemption_spares_jobs_without_checkpoint_or_too_young() -> None:
    cluster = [node("n1", gpus=2)]
    busy = [
        running("no-ckpt", "n1", (0,), cls="low", preemptible=False),
        running("young", "n1", (1,), cls="low", ran_s=60, preemptible=True),
    ]
    result = plan(state(cluster, [job("urgent", cls="urgent")], busy), NOW)
    assert result.preemptions == () and result.starts == ()


def test_high_jobs_are_never_preempted() -> None:
    cluster = [node("n1", gpus=1)]
    busy = [running("high", "n1", (0,), cls="high", preemptible=True)]
    assert plan(state(cluster, [job("urgent", cls="urgent")], busy), NOW).preemptions == ()


def test_team_quota_holds_a_job_with_a_reason_and_time() -> None:
    cluster = [node("n1", gpus=8)]
    busy = [running("r", "n1", (0, 1), team="vision", left_s=3 * HOUR)]
    teams = {"vision": TeamPolicy(max_gpus=2)}
    result = plan(state(cluster, [job("j")], busy, teams=teams), NOW)
    assert result.starts == ()
    entry = result.queue[0]
    assert entry.reason.startswith("over team quota (2 of 2 GPUs in use) until ")
    assert entry.estimated_start == pytest.approx(NOW + 3 * HOUR, abs=1)


def test_user_daily_quota_holds_a_job_until_usage_ages_out() -> None:
    """A job that may not be preempted waits, over the quota, until enough usage leaves the window."""
    cluster = [node("n1", gpus=8)]
    config = fair(user_gpu_hours_per_day=20)
    expiry = {"ann": ((NOW + 2 * HOUR, 10 * HOUR), (NOW + 5 * HOUR, 10.5 * HOUR))}
    result = plan(
        state(
            cluster,
            [job("j", walltime_s=2 * HOUR, preemptible=False)],
            config=config,
            user_usage_24h={"ann": 20.5 * HOUR},
            user_usage_expiry=expiry,
        ),
        NOW,
    )
    assert result.starts == ()
    assert result.queue[0].estimated_start == pytest.approx(NOW + 2 * HOUR, abs=1)
    assert "over daily GPU-hour quota" in result.queue[0].reason
    assert result.wake_at == pytest.approx(NOW + 2 * HOUR, abs=1)


def test_job_that_can_never_fit_gets_no_eta() -> None:
    result = plan(state([node("n1", gpus=4)], [job("huge", gpus=8)]), NOW)
    assert result.queue[0].estimated_start is None
    assert "can ever fit" in result.queue[0].reason


def test_every_waiting_job_gets_position_eta_and_reason() -> None:
    cluster = [node("n1", gpus=2)]
    busy = [running("r", "n1", (0, 1), left_s=HOUR)]
    queue = [job(f"j{i}", user=f"u{i}", walltime_s=HOUR) for i in range(5)]
    result = plan(state(cluster, queue, busy), NOW)
    assert [e.position for e in result.queue] == [1, 2, 3, 4, 5]
    assert all(e.estimated_start is not None and e.reason for e in result.queue)
    assert sorted(e.estimated_start for e in result.queue) == [e.estimated_start for e in result.queue]
    assert result.queue[-1].reason.startswith("behind 4 higher-priority jobs")


def test_gpu_model_constraint_is_honoured() -> None:
    cluster = [node("a", gpus=1, model="T4"), node("b", gpus=1, model="A100")]
    result = plan(state(cluster, [job("j", gpu_models=("A100",))]), NOW)
    assert result.starts[0].node == "b"


def test_whole_gpu_job_goes_to_the_fullest_node() -> None:
    cluster = [node("empty", gpus=8), node("busy", gpus=8)]
    busy = [running("r", "busy", tuple(range(6)), left_s=10 * HOUR)]
    assert plan(state(cluster, [job("j", walltime_s=HOUR)], busy), NOW).starts[0].node == "busy"


def test_zero_half_life_is_rejected() -> None:
    with pytest.raises(ValueError):
        PolicyConfig(half_life_s=0)
    with pytest.raises(ValueError):
        DecayedUsage(half_life_s=0)


def test_decayed_usage_halves_after_one_half_life() -> None:
    usage = DecayedUsage(half_life_s=7 * 86400)
    usage.add(("t", "u"), 1000.0, at=0.0)
    assert usage.value(("t", "u"), now=7 * 86400) == pytest.approx(500.0)
    usage.add(("t", "u"), 500.0, at=7 * 86400)
    assert usage.snapshot(14 * 86400)[("t", "u")] == pytest.approx(500.0)


def test_rolling_usage_forgets_after_a_day() -> None:
    usage = RollingUsage(bucket_s=300)
    usage.add("ann", 3600.0, at=1000.0)
    assert usage.total("ann", now=2000.0) == 3600.0
    ((leaves_at, amount),) = usage.expiries("ann", now=2000.0)
    assert amount == 3600.0 and 1000.0 + 86400 <= leaves_at <= 1300.0 + 86400
    assert usage.total("ann", now=leaves_at) == 0.0


def test_admission_rejects_what_can_never_start() -> None:
    cluster = [node("n1", gpus=4)]
    config = PolicyConfig(max_gpus_per_job=2)
    assert admission_error(cluster, job("j", gpus=4), config) is not None
    # Long jobs are admitted: the daily quota limits GPU-hours already used, not planned ones.
    assert admission_error(cluster, job("j", gpus=2, walltime_s=72 * HOUR), config) is None
    assert admission_error(cluster, job("j", gpus=2, walltime_s=HOUR), config) is None
    assert fits_empty_cluster(cluster, job("j", gpus=4))
    assert not fits_empty_cluster(cluster, JobRequest("j", "t", "u", NOW, gpus=8))
