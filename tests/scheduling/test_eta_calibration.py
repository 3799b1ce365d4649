"""ETA ranges calibrated on the track record (policy/eta_calibration.py): pure, small inputs."""

from __future__ import annotations

import bisect
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
    assert 5.5 * 86400 <= point - NOW <= high - NOW <= 6.5 * 86400
    # The next bucket is on the pooled interval (both modes): it yields to this one, whose range
    # stays its own, and shows a low end no earlier at their edge (trial25 F1: a longer predicted
    # wait never shows an earlier low end).
    _, next_low, _ = cal.calibrate(NOW, NOW + EDGES_S[-1])
    assert 5.5 * 86400 <= low - NOW and low <= next_low
    # A 5-hour prediction's bucket is empty: it gets the pooled interval (both modes; what it
    # shows is then kept in order with its neighbours, as every bucket's).
    pooled = Calibration._interval([math.log((a + OFFSET_S) / (p + OFFSET_S)) for p, a in history], 0.8)
    assert cal.intervals[bisect.bisect_right(EDGES_S, 5 * HOUR)] == pytest.approx(pooled)
    assert pooled[2] - pooled[1] > cal.intervals[-2][2] - cal.intervals[-2][1]
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


def _in_order(values: list[float]) -> bool:
    return all(b >= a - 1e-6 for a, b in zip(values, values[1:], strict=False))


def _edge_history() -> tuple[tuple[float, float], ...]:
    """A track record whose < 10 min bucket says "ETAs were ~40 min early" and whose 10 min - 1 h
    bucket says "ETAs were late": each bucket's own mapping is monotone, their seam is not."""
    short = [(p, p + 2400.0 + 30.0 * (i % 9)) for i, p in enumerate(14.0 * k for k in range(1, 41))]
    medium = [(p, 0.2 * p + 10.0 * (i % 9)) for i, p in enumerate(700.0 + 90.0 * k for k in range(30))]
    return tuple(short + medium)


def test_queued_jobs_that_cannot_overtake_are_shown_in_queue_order_across_a_calibration_bucket_edge() -> None:
    """One GPU, one running job with 340 s left, then same-shape jobs of one user in a strict order
    (nothing can backfill on one GPU): whatever the track record says, a later position never shows
    an earlier start, nor an earlier low or high end (trial25 F1: "position 3: starts in 28 s,
    position 1: in 33 s"). The model's points straddle the 600 s bucket edge; each bucket's
    calibration maps its own points in order, but the short bucket's "40 min late" and the next
    one's "early" put the job past the edge before the ones ahead of it."""
    cluster = [node("n1", gpus=1)]
    busy = [running("r30", "n1", (0,), left_s=340.0)]
    queue = [job(f"q{i}", age_s=60.0 - i, walltime_s=w) for i, w in enumerate((40.0, 50.0, 60.0, 3000.0))]
    history = _edge_history()
    result = plan(state(cluster, queue, busy, eta_history=history), NOW)
    assert [e.job_id for e in result.queue] == ["q0", "q1", "q2", "q3"]
    model = [e.estimated_start_model - NOW for e in result.queue]
    assert _in_order(model) and model[1] < EDGES_S[0] < model[-1]  # the model's own points straddle the edge
    for field in ("estimated_start", "estimated_start_low", "estimated_start_high"):
        shown = [getattr(e, field) for e in result.queue]
        assert _in_order(shown), (field, [round(t - NOW) for t in shown], [round(m) for m in model])
    for e in result.queue:
        assert e.estimated_start_low <= e.estimated_start <= e.estimated_start_high
        assert e.reason.endswith(fmt_time(e.estimated_start, NOW))


def test_the_calibrated_mapping_never_shows_a_longer_predicted_wait_as_an_earlier_start() -> None:
    """Calibration.calibrate is monotone in the predicted wait, point and both ends, across every
    bucket edge, for any track record (seeded random records, including ones that disagree by
    bucket); buckets that agree are each their own map, unchanged."""
    for seed in range(200):
        rng = random.Random(seed)
        history = [
            (p, p * math.exp(rng.gauss(rng.choice((-1.5, 0.0, 1.5)), 0.5)) + rng.choice((0.0, 3000.0)))
            for p in (rng.choice(EDGES_S) * rng.uniform(0.3, 1.7) for _ in range(rng.randint(30, 400)))
        ]
        cal = Calibration(history, 0.88, 30)
        last = (0.0, 0.0, 0.0)
        for wait in sorted([e + d for e in EDGES_S for d in (-1.0, -1e-3, 0.0, 1e-3, 1.0)] + [0.0, 5.0, 4e6]):
            got = cal.calibrate(NOW, NOW + wait)
            assert got[1] <= got[0] <= got[2]
            assert all(g >= prev - 1e-6 for g, prev in zip(got, last, strict=True)), (seed, wait, got, last)
            last = got
    history = _edge_history()
    cal = Calibration(history, 0.88, 30)
    f_mid, f_lo, f_hi = cal.factors[0]
    _, low, high = cal.calibrate(NOW, NOW + 300.0)  # the first bucket: nothing below it, the next says "early"
    assert low - NOW <= max(0.0, (300.0 + OFFSET_S) * f_lo - OFFSET_S)
    assert high - NOW == pytest.approx(max(0.0, (300.0 + OFFSET_S) * f_hi - OFFSET_S))  # nothing below to raise it
    # A bucket with records of its own only ever has its range widened: every start its own map
    # held, it holds (a bucket on the pooled interval is kept between those instead: clamps)
    for seed in range(40):
        rng = random.Random(seed)
        history = [(p, p * math.exp(rng.gauss(rng.choice((-1.5, 0.0, 1.5)), 0.5)))
                   for p in (rng.choice(EDGES_S) * rng.uniform(0.3, 1.7) for _ in range(rng.randint(30, 400)))]
        widened = Calibration(history, 0.88, 30)
        for wait in (1.0, 500.0, 3000.0, 10_000.0, 40_000.0, 100_000.0, 300_000.0, 1e6):
            bucket = bisect.bisect_right(EDGES_S, wait)
            factors = widened.factors[bucket]
            if factors is None or widened.clamps[bucket] is not None:
                continue
            own_low, own_high = ((wait + OFFSET_S) * f - OFFSET_S for f in factors[1:])
            _, low, high = widened.calibrate(NOW, NOW + wait)
            assert low - NOW <= max(0.0, own_low) + 1e-6 and high - NOW >= max(0.0, own_high) - 1e-6, (seed, wait)
    # every record late by the same score: the same map in every bucket, continuous at the edges
    agreeing = Calibration([(p, 1.5 * (p + OFFSET_S) - OFFSET_S) for p in (300.0 * k for k in range(1, 400))], 0.88, 30)
    for wait in (300.0, 5000.0, 20 * HOUR):  # buckets that agree: each its own map, unchanged
        f_mid, f_lo, f_hi = agreeing.factors[bisect.bisect_right(EDGES_S, wait)]
        got = agreeing.calibrate(NOW, NOW + wait)
        assert [t - NOW for t in got] == pytest.approx(
            [max(0.0, (wait + OFFSET_S) * f - OFFSET_S) for f in (f_mid, f_lo, f_hi)])


def test_a_bucket_on_the_pooled_interval_is_kept_between_its_neighbours_not_a_floor_for_them() -> None:
    """Hours-ahead ETAs right, days-ahead ones 2.5x late-predicted (early starts), nothing in
    between: the empty 16 h - 2.5 days bucket shows the pooled interval, but it does not raise the
    days-ahead bucket's high end to the pool's (docs: half the width over the mean wait on 4x8);
    it is clamped between its neighbours instead, and the map stays in order."""
    history = [(8 * HOUR, 8 * HOUR * (1 + 0.01 * (i % 7))) for i in range(200)]
    history += [(5 * 86400.0, 2 * 86400.0 * (1 + 0.01 * (i % 7))) for i in range(200)]
    cal = Calibration(history, 0.8, 30)
    long_bucket = bisect.bisect_right(EDGES_S, 3 * 86400.0)
    assert cal.clamps[long_bucket] is None and cal.clamps[long_bucket - 1] is not None
    f_mid, f_lo, f_hi = cal.factors[long_bucket]
    _, _, high = cal.calibrate(NOW, NOW + 3 * 86400.0)
    assert high - NOW == pytest.approx((3 * 86400.0 + OFFSET_S) * f_hi - OFFSET_S)  # its own map
    pooled_at_edge = (EDGES_S[-1] + OFFSET_S) * cal.factors[long_bucket - 1][2] - OFFSET_S
    assert high - NOW < pooled_at_edge  # what the pooled bucket below would have floored it to
    shown = [cal.calibrate(NOW, NOW + w) for w in (10 * HOUR, 16 * HOUR, 30 * HOUR, 59 * HOUR, 61 * HOUR, 3 * 86400.0)]
    for field in range(3):
        assert _in_order([got[field] for got in shown])
    for got in shown:
        assert got[1] <= got[0] <= got[2]


def _disagreeing_history(rng: random.Random) -> list[tuple[float, float]]:
    """Records around every bucket edge whose buckets say "early", "right" or "late" at random
    (some buckets empty, so they take the pooled interval)."""
    edges = rng.sample(EDGES_S, rng.randint(1, len(EDGES_S)))
    return [
        (p, p * math.exp(rng.gauss(rng.choice((-1.5, 0.0, 1.5)), 0.5)) + rng.choice((0.0, 3000.0)))
        for p in (rng.choice(edges) * rng.uniform(0.3, 1.7) for _ in range(rng.randint(30, 400)))
    ]


def test_the_pass_shows_exactly_what_calibrate_gives_for_the_model_point() -> None:
    """Explainer.explain inlines Calibration.calibrate (no call per waiting job): both give the
    same (point, low, high), bit for bit, for model points on, just below and just above every
    bucket edge, whatever the track record. One node, each GPU busy until one of those waits (a
    running job per GPU), one queued job per GPU: the pooled sweep gives the k-th job the k-th
    earliest end, so the model's points are exactly those waits."""
    tiny = 1 / 1024  # exact at NOW's magnitude: NOW + wait - NOW == wait
    near_edges = {e + d for e in EDGES_S for d in (-1.0, -tiny, 0.0, tiny, 1.0)}
    waits = sorted(near_edges | {1.0, 5.0, 300.0, 2e3, 1e4, 3e4, 1e5, 4e6})
    cluster = [node("n1", gpus=len(waits))]
    busy = [running(f"r{i}", "n1", (i,), left_s=w) for i, w in enumerate(waits)]
    long = 1e7  # longer than every wait: no queued job's end is an earlier slot than the next running end
    queue = [job(f"q{i}", user=f"u{i % 5}", walltime_s=long, timeout_s=2 * long) for i in range(len(waits))]
    pooled_only = replace(bare_config(), eta_scenarios=0)
    for seed in range(30):
        history = tuple(_disagreeing_history(random.Random(seed)))
        cal = Calibration(history, pooled_only.eta_coverage, pooled_only.eta_calibration_min)
        result = plan(state(cluster, queue, busy, config=pooled_only, eta_history=history), NOW)
        assert sorted(e.estimated_start_model - NOW for e in result.queue) == waits  # on the edges
        for e in result.queue:
            got = (e.estimated_start, e.estimated_start_low, e.estimated_start_high)
            assert got == cal.calibrate(NOW, e.estimated_start_model), (seed, e.estimated_start_model - NOW)
            assert got[1] <= got[0] <= got[2]  # no clamp keeps it there: see Calibration.calibrate
    # Forward-simulated points at the head and coarse ones below it take the same path
    inflow = tuple(job(f"f{i}", user=f"u{i % 7}", age_s=600.0 * i, walltime_s=HOUR * (1 + i % 4)) for i in range(60))
    queue = [job(f"q{i}", user=f"u{i % 5}", walltime_s=HOUR * (1 + i % 3)) for i in range(40)]
    config = replace(bare_config(), eta_head=10)
    for seed in range(5):
        history = tuple(_disagreeing_history(random.Random(seed)))
        cal = Calibration(history, config.eta_coverage, config.eta_calibration_min)
        result = plan(state(cluster, queue, busy, config=config, eta_history=history, inflow=inflow), NOW)
        assert len(result.queue) == len(queue)
        for e in result.queue:
            got = (e.estimated_start, e.estimated_start_low, e.estimated_start_high)
            assert got == cal.calibrate(NOW, e.estimated_start_model), (seed, e.job_id)
