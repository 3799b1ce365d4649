"""ETA ranges calibrated on the track record (policy/eta_calibration.py): pure, small inputs."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from apps.scheduling.policy import PolicyConfig, plan
from apps.scheduling.policy.eta_calibration import EDGES_S, HISTORY_N, OFFSET_S, Calibration, calibration_for
from apps.scheduling.policy.explain import fmt_time
from apps.scheduling.simulator import TraceTask, load_nodes, simulate_policy

from .policy_helpers import HOUR, NOW, job, node, running, state


def skewed_history(rng: random.Random, n: int) -> list[tuple[float, float]]:
    """Predicted waits of 1-3 h; actual = predicted x a skewed, mostly-late factor (as on the trace)."""
    out = []
    for _ in range(n):
        predicted = rng.uniform(HOUR, 3 * HOUR)
        factor = math.exp(rng.gauss(0.7, 0.4)) if rng.random() < 0.85 else math.exp(rng.gauss(3.0, 1.0))
        out.append((predicted, predicted * factor))
    return out


def covered(cal: Calibration, pairs: list[tuple[float, float]]) -> float:
    hits = 0
    for predicted, actual in pairs:
        point, low, high = cal.calibrate(NOW, NOW + predicted)
        assert low <= point <= high
        hits += low - 1 <= NOW + actual <= high + 1
    return hits / len(pairs)


def test_a_range_from_a_stationary_record_holds_the_asked_share_of_new_starts() -> None:
    rng = random.Random(7)
    cal = Calibration(skewed_history(rng, HISTORY_N), 0.8, 30)
    fresh = skewed_history(rng, 4000)
    assert 0.77 <= covered(cal, fresh) <= 0.86
    # The uncalibrated guess (the point, +-50 %) would hold few of them: the record says "later".
    assert sum(0.5 * p <= a <= 1.5 * p for p, a in fresh) / len(fresh) < 0.3


def test_the_range_is_the_shortest_that_holds_the_share_not_the_central_one() -> None:
    """A skewed record (a tight mode and a long tail): the shortest 80 % window leaves the tail out."""
    rng = random.Random(3)
    history = skewed_history(rng, HISTORY_N)
    cal = Calibration(history, 0.8, 30)
    _, low, high = cal.calibrate(NOW, NOW + 2 * HOUR)
    scores = sorted(math.log((a + 300) / (p + 300)) for p, a in history)
    central_hi = scores[int(0.9 * len(scores))]
    assert math.log((high - NOW + 300) / (2 * HOUR + 300)) < central_hi
    assert NOW + HOUR < low and high > NOW + 3 * HOUR  # shifted later: the record says ETAs are early


def test_each_predicted_wait_bucket_learns_its_own_error_and_falls_back_to_the_pool() -> None:
    """Minutes-ahead ETAs were right, day-ahead ones 3x early: each bucket gets its own range."""
    history = [(300.0, 300.0 * (1 + 0.01 * (i % 7))) for i in range(200)]
    history += [(2 * 86400.0, 6 * 86400.0 * (1 + 0.01 * (i % 7))) for i in range(200)]
    cal = Calibration(history, 0.8, 30)
    _, low, high = cal.calibrate(NOW, NOW + 300)
    assert 250 <= low - NOW <= high - NOW <= 400
    point, low, high = cal.calibrate(NOW, NOW + 2 * 86400)
    assert 5.5 * 86400 <= low - NOW <= point - NOW <= high - NOW <= 6.5 * 86400
    # A 5-hour prediction's bucket is empty: it gets the pooled interval (both modes).
    _, *pooled = cal.calibrate(NOW, NOW + 5 * HOUR)
    assert pooled[1] - pooled[0] > high - low
    assert len(cal.intervals) == len(EDGES_S) + 1


def test_too_little_record_or_switched_off_leaves_the_forward_range() -> None:
    assert calibration_for([(60.0, 120.0)] * 29, 0.8, 30) is None
    assert calibration_for([(60.0, 120.0)] * 30, 0.0, 30) is None
    assert calibration_for([(60.0, 120.0)] * 30, 0.8, 30) is not None
    with pytest.raises(ValueError, match="eta_coverage"):
        PolicyConfig(eta_coverage=1.0)


def test_a_pass_calibrates_the_eta_and_its_range_but_changes_no_start() -> None:
    cluster = [node("n1", gpus=2)]
    busy = [running(f"r{i}", "n1", (i,), left_s=HOUR * (i + 1)) for i in range(2)]
    queue = [job(f"q{i}", user=f"u{i}", walltime_s=2 * HOUR, cls="low") for i in range(4)]
    # ETAs were 3x early (in the score's terms: (actual + c) = 3 (predicted + c), c = OFFSET_S)
    history = tuple((p, 3 * (p + OFFSET_S) - OFFSET_S) for p in (600.0 * k for k in range(1, 200)))
    bare = plan(state(cluster, queue, busy), NOW)
    calibrated = plan(state(cluster, queue, busy, eta_history=history), NOW)
    assert calibrated.starts == bare.starts and calibrated.preemptions == bare.preemptions
    assert [e.job_id for e in calibrated.queue] == [e.job_id for e in bare.queue]
    assert [e.estimated_start_model for e in calibrated.queue] == [e.estimated_start for e in bare.queue]
    for e in calibrated.queue:
        expected = 3 * (e.estimated_start_model - NOW + OFFSET_S) - OFFSET_S
        for t in (e.estimated_start, e.estimated_start_low, e.estimated_start_high):
            assert t - NOW == pytest.approx(expected, abs=1.0)
        assert e.reason.endswith(fmt_time(e.estimated_start, NOW))  # the reason says the calibrated time
    off = plan(state(cluster, queue, busy, eta_history=history, config=replace(bare_config(), eta_coverage=0.0)), NOW)
    assert [(e.estimated_start, e.estimated_start_low, e.estimated_start_high) for e in off.queue] == [
        (e.estimated_start, e.estimated_start_low, e.estimated_start_high) for e in bare.queue
    ]


def bare_config() -> PolicyConfig:
    return PolicyConfig(policy="fair", user_gpu_hours_per_day=None)


def test_the_simulator_calibrates_on_started_jobs_only_and_no_start_moves(monkeypatch) -> None:
    """One GPU, a job every 40 min of 10-80 min each (load ~1.1, seeded): calibration must not
    move a start (ETAs never do) but lowers the point's error; the record the simulator hands each pass holds exactly the
    jobs that waited and first started before that pass (the past only); and it changes the ranges."""
    import apps.scheduling.simulator as sim

    rng = random.Random(5)
    tasks = [TraceTask(f"t{i:03d}", 2400.0 * i, rng.uniform(600, 4800), 1.0, (), 1000, 1024, "BE") for i in range(150)]
    owners = [("team-a", f"u{i % 3}") for i in range(150)]
    seen: list[tuple[float, tuple[tuple[float, float], ...]]] = []
    jobs: dict = {}
    real_plan, real_metrics = sim.plan, sim._metrics

    def spy(st, t):
        seen.append((t, st.eta_history))
        return real_plan(st, t)

    def keep(j, *a, **k):
        jobs.update(j)
        return real_metrics(j, *a, **k)

    base = replace(bare_config(), eta_scenarios=2, eta_calibration_min=10)
    monkeypatch.setattr(sim, "plan", spy)
    monkeypatch.setattr(sim, "_metrics", keep)
    on = simulate_policy(tasks, owners, load_nodes("1x1"), base, seed=1, walltime_sigma=0.3)
    monkeypatch.setattr(sim, "plan", real_plan)
    off = simulate_policy(tasks, owners, load_nodes("1x1"), replace(base, eta_coverage=0.0), seed=1, walltime_sigma=0.3)
    for key in ("mean_wait_s", "p99_wait_s", "max_wait_s", "utilization", "jain_fairness", "preemptions"):
        assert on[key] == off[key], key
    assert on["_waits"] == off["_waits"]
    started = sorted(
        (j.first_start, j.eta_model_at_submit - j.task.submit, j.first_start - j.task.submit)
        for j in jobs.values()
        if j.first_start is not None and j.first_start > j.task.submit
    )
    for t, history in seen:
        assert list(history) == [(p, a) for s, p, a in started if s < t][-HISTORY_N:]
    assert max(len(h) for _, h in seen) > 30
    assert on["eta_coverage_waiting"] > off["eta_coverage_waiting"] + 0.2
    assert on["eta_mae_s"] < off["eta_mae_s"]
