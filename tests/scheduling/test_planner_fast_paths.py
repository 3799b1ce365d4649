"""The planning pass's shortcuts give exactly what the plain code gave (docs/scheduling.md,
"Determinism and speed"): each is checked against the straightforward version here; the
property tests check whole plans."""

from __future__ import annotations

import copy
import dataclasses
import gc
import pickle
import random

from apps.scheduling.policy import ClusterState, PolicyConfig, QueueEntry, plan
from apps.scheduling.policy.explain import _entry
from apps.scheduling.policy.placement import Placer, capacities, shape_of
from apps.scheduling.policy.priority import Ranked, _by_priority

from .policy_helpers import HOUR, NOW, job, node, running


def test_a_fast_queue_entry_is_a_queue_entry_with_every_field() -> None:
    values = ("j1", 3, 1234.5, {"fairshare": 1.0}, NOW + 60, "waiting", "n1", NOW + 30, NOW, NOW + 90, NOW + 45)
    fast = _entry(*values)
    assert type(fast) is QueueEntry
    assert fast == QueueEntry(*values)
    assert [f.name for f in dataclasses.fields(QueueEntry)] == list(vars(fast))


def test_priority_order_is_the_one_sort_on_priority_then_age_then_id() -> None:
    rng = random.Random(7)
    rows = [
        Ranked(
            float(rng.choice((1.0, 2.0, 2.5, 3.0, -0.0, 0.0))),
            job(f"j{k:03d}", age_s=float(rng.choice((0, 60, 120)))),
            "medium",
            (0.0, 0.0, 0.0, 0.0),
        )
        for k in range(300)
    ]
    rng.shuffle(rows)
    expected = sorted(rows, key=lambda r: (-r[0], r[1].submitted_at, r[1].job_id))
    assert [r.job.job_id for r in _by_priority(list(rows))] == [r.job.job_id for r in expected]


def test_the_placer_forgets_where_a_shape_fits_when_capacity_changes() -> None:
    """Where a shape fits is kept between jobs of that shape, and redone after a take or release."""
    nodes = [node("a", gpus=2), node("b", gpus=4)]
    busy = running("r1", "b", (0, 1, 2), left_s=HOUR)
    placer = Placer(capacities(nodes, [busy]), None, NOW)
    first, second = job("j1", gpus=1), job("j2", gpus=1)
    assert shape_of(first) == shape_of(second)
    assert placer.place(first)[0] == "b"  # best fit: the node left with fewest idle GPUs
    assert placer.place(second)[0] == "a"  # b is full now: not the kept answer
    placer.release(busy)
    assert placer.place(job("j3", gpus=3))[0] == "b"


def test_jobs_have_one_shape_number_exactly_when_they_have_one_shape() -> None:
    """The planner keys its sets and memos by ``JobRequest.shape_id``, not the shape tuple."""
    jobs = [
        job(f"j{k}", gpus=g, cpu_milli=c, gpu_models=m, walltime_s=w)
        for k, (g, c, m, w) in enumerate(
            [(1, 0, (), HOUR), (1, 0, (), 2 * HOUR), (1, 4000, (), HOUR), (2, 0, (), HOUR), (0.5, 0, (), HOUR),
             (1, 0, ("A100",), HOUR), (1, 0, ("H100",), HOUR), (1, 0, ("A100",), 3 * HOUR), (1.0, 0, (), 5 * HOUR)]
        )
    ]
    for a in jobs:
        for b in jobs:
            assert (a.shape_id == b.shape_id) == (shape_of(a) == shape_of(b)), (a.job_id, b.job_id)
    for j in jobs:  # a copy, or a job unpickled (in this or another process), numbers its shape here
        assert copy.copy(j).shape_id == j.shape_id
        assert pickle.loads(pickle.dumps(j)).shape_id == j.shape_id
        other = copy.copy(j)
        other.__setstate__({**vars(j), "shape_id": -7})  # as another process may have numbered it
        assert other.shape_id == j.shape_id


def test_a_request_with_another_walltime_is_what_replace_makes(monkeypatch) -> None:
    """``JobRequest.with_walltime`` (a kept queue estimated again) is ``dataclasses.replace``
    field for field, the derived ones included (which ``==`` does not compare): no estimate,
    one past the timeout, one under a second; also after the shape table was emptied."""
    from apps.scheduling.policy import types

    base = [job("a", gpus=2.0, gpu_models=("A100",), walltime_s=HOUR), job("b", gpus=0.5, walltime_s=None),
            dataclasses.replace(job("c", walltime_s=HOUR), timeout_s=600.0)]
    for request in base:
        for walltime_s in (None, 30.0, 0.2, 2 * HOUR, 100 * HOUR):
            assert vars(request.with_walltime(walltime_s)) == vars(dataclasses.replace(request, walltime_s=walltime_s))
    monkeypatch.setattr(types, "_SHAPE_IDS_KEPT", 0)  # every new shape empties the table
    job("other", image="build-x")
    assert vars(base[0].with_walltime(5.0)) == vars(dataclasses.replace(base[0], walltime_s=5.0))


def test_shape_numbers_stay_distinct_when_the_table_is_emptied(monkeypatch) -> None:
    """The table of shape numbers is emptied when large (a free-text image per build would
    grow it without end); numbers are never reused, so distinct shapes keep distinct ones."""
    from apps.scheduling.policy import types

    monkeypatch.setattr(types, "_SHAPE_IDS_KEPT", len(types._SHAPE_IDS) + 3)
    jobs = [job(f"i{k}", image=f"build-{k}") for k in range(10)]
    assert len(types._SHAPE_IDS) < 10  # emptied on the way
    assert len({j.shape_id for j in jobs}) == 10
    assert job("again", image="build-9").shape_id == jobs[9].shape_id  # numbered since the last emptying


def test_a_pass_restores_the_garbage_collector_and_leaves_no_cycles() -> None:
    """plan() pauses the cyclic collector for the pass: it must put it back as it was, and
    the pass must make no reference cycles (they would wait for the next collection)."""
    cluster = [node("n1", gpus=2), node("n2", gpus=8)]
    busy = [running("r1", "n1", (0,), left_s=HOUR, preemptible=True)]
    queue = [job(f"j{k}", gpus=float(1 + k % 3), user=f"u{k % 4}", age_s=60.0 * k) for k in range(40)]
    config = PolicyConfig(policy="fair", size_preemption=True, bounded_wait=True, fragmentation_aware=True)
    state = ClusterState(nodes=tuple(cluster), running=tuple(busy), queued=tuple(queue), config=config)
    try:
        gc.disable()
        plan(state, NOW)
        assert not gc.isenabled()
        gc.enable()
        gc.collect()
        result = plan(state, NOW)
        assert gc.isenabled()
        assert result.queue
        del result
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_the_forward_simulations_kept_shadow_equals_a_fresh_walk() -> None:
    """ForwardSim.shadow keeps its answer across starts on other nodes that end no earlier
    than the event it found, and across whole-GPU starts that end before it when the shape
    fitted nowhere (eta.py): after random starts, releases and shadows on random clusters,
    every kept answer equals the walk done afresh on the same state (probes that fit now
    included: for them the second rule must not apply)."""
    from apps.scheduling.policy.eta import ForwardSim, _alloc_of

    kept = kept_whole = 0
    for seed in range(80):
        rng = random.Random(seed)
        cluster = [node(f"n{k}", gpus=rng.choice((2, 4, 8)), cpu=rng.choice((16000, 64000))) for k in range(6)]
        busy = []
        for k, n in enumerate(cluster):
            free = list(range(len(n.gpus)))
            rng.shuffle(free)
            while len(free) > rng.choice((0, 0, 1)):
                size = min(rng.choice((1, 1, 2, 4)), len(free))
                share = rng.choice((1.0, 1.0, 0.5)) if size == 1 else 1.0
                taken = tuple(sorted(free.pop() for _ in range(size)))
                busy.append(
                    running(f"r{k}-{len(busy)}", n.name, taken, left_s=rng.uniform(60, 10 * HOUR), share=share,
                            cpu_milli=rng.choice((0, 4000, 8000)))
                )
        sim = ForwardSim(capacities(cluster, busy), busy, None, NOW, 1000)
        shapes = [
            job(f"s{i}", gpus=g, cpu_milli=c, walltime_s=HOUR)
            for i, (g, c) in enumerate(((1, 0), (2, 4000), (4, 0), (8, 0), (0.5, 0), (3, 30000)))
        ]
        t = NOW
        for step in range(120):
            op = rng.random()
            if op < 0.45:  # a start where it fits
                longest = 12 * HOUR if seed % 2 else HOUR  # short ones: ending before the event found
                j = job(f"x{seed}-{step}", gpus=rng.choice((0.5, 1, 1, 2)), walltime_s=rng.uniform(60, longest))
                placed = sim.placer.place(j)
                if placed is not None:
                    end = t + j.walltime
                    sim.push(end, _alloc_of(j, *placed, t, end))
            elif op < 0.6 and sim.cursor < len(sim.events):  # time passes: the next end
                t = max(t, sim.events[sim.cursor][0])
                sim.placer.now = t
                sim._release_until(t)
            else:
                probe = shapes[0] if rng.random() < 0.3 else rng.choice(shapes)
                if rng.random() < 0.7:  # as run() does: a shape that fits nowhere is in Placer.failed
                    next(sim.placer.candidates(probe), None)
                memo = sim._shadow
                if memo is not None and memo[0] == probe.shape_id and memo[1] != sim.seq and memo[2] is not None:
                    kept += 1  # a case the kept answer may serve
                    since = sim._pushed[memo[1] - sim._seq0 :]
                    if memo[4] and any(whole and end < memo[3][1] for _, end, whole in since):
                        kept_whole += 1  # ... across a whole-GPU start that ends before the event found
                got = sim.shadow(probe)
                sim._shadow = None
                assert got == sim.shadow(probe), (seed, step)
    assert kept > 200  # the kept answer was put to the test often
    assert kept_whole > 10, kept_whole


def test_the_shadow_walks_lazy_node_copies_find_what_releasing_every_event_finds() -> None:
    """ForwardSim.shadow copies a node for a whole-GPU shape only once its events could give
    it enough idle GPUs (eta.py): on random clusters with whole, multi-GPU and shared GPUs
    (two halves on one GPU too), every walk equals the plain one, which copies each node at
    its first event and tries the job after every release."""
    from apps.scheduling.policy.eta import ForwardSim

    def plain_walk(sim: ForwardSim, probe) -> tuple[str, float] | None:
        copies = {}
        for end, _, alloc in sim.events[sim.cursor :]:
            cap = copies.get(alloc.node)
            if cap is None:
                cap = copies[alloc.node] = sim.caps[alloc.node].copy()
            cap.release(alloc)
            if cap.fit(probe) is not None:
                return alloc.node, end
        return None

    found = 0
    for seed in range(60):
        rng = random.Random(seed)
        cluster = [node(f"n{k}", gpus=rng.choice((2, 4, 8)), cpu=rng.choice((16000, 64000))) for k in range(6)]
        busy = []
        for k, n in enumerate(cluster):
            free = list(range(len(n.gpus)))
            rng.shuffle(free)
            while len(free) > rng.choice((0, 0, 1)):
                size = min(rng.choice((1, 1, 2, 4)), len(free))
                taken = tuple(sorted(free.pop() for _ in range(size)))
                kw = {"left_s": rng.uniform(60, 10 * HOUR), "cpu_milli": rng.choice((0, 4000, 8000))}
                if size == 1 and rng.random() < 0.3:  # a shared GPU: two halves, ending apart
                    busy.append(running(f"r{k}-{len(busy)}", n.name, taken, share=0.5, **kw))
                    kw["left_s"] = rng.uniform(60, 10 * HOUR)
                    busy.append(running(f"r{k}-{len(busy)}", n.name, taken, share=0.5, **kw))
                else:
                    busy.append(running(f"r{k}-{len(busy)}", n.name, taken, **kw))
        sim = ForwardSim(capacities(cluster, busy), busy, None, NOW, 1000)
        shapes = [
            job(f"s{i}", gpus=g, cpu_milli=c, walltime_s=HOUR)
            for i, (g, c) in enumerate(((1, 0), (2, 4000), (3, 0), (4, 0), (8, 0), (0.5, 0), (2, 60000)))
        ]
        for _ in range(4):
            for probe in shapes:
                sim._shadow = None
                got = sim.shadow(probe)
                assert got == plain_walk(sim, probe), (seed, probe.gpus)
                found += got is not None
            if sim.cursor < len(sim.events):  # time passes: a few ends released
                t = sim.events[min(len(sim.events) - 1, sim.cursor + rng.randrange(1, 6))][0]
                sim.placer.now = t
                sim._release_until(t)
    assert found > 500


def _plain_forward_run(sim, pending, seen: list[int]) -> dict[str, float]:
    """ForwardSim.run without its shortcuts (no arrivals): every pending job due is offered to
    place() in every scan, the shadow's refusals included. ``seen[0]`` counts the offers of a
    shape the shadow had refused earlier in the same scan (those run() skips or re-checks)."""
    import math

    from apps.scheduling.policy.eta import ArrivalStream, _alloc_of

    starts: dict[str, float] = {}
    wanted = sum(1 for p in pending if p.interest)
    placer, t, order, changed, next_t0 = sim.placer, sim.now, list(pending), True, math.inf
    arrivals = ArrivalStream.empty()
    for _ in range(sim.max_steps):
        changed = changed or next_t0 <= t
        if not changed:
            t = sim._advance(t, next_t0, arrivals)
            if t is None:
                break
            changed = sim._release_until(t)
            continue
        changed, blocked, blocked_seen, next_t0, refused = False, None, False, math.inf, set()
        placer.now = t
        for p in order:
            if p.t0 > t:
                next_t0 = min(next_t0, p.t0)
                continue
            if p.job.shape_id in placer.failed:
                if not blocked_seen:
                    blocked_seen, blocked = True, sim.shadow(p.job)
                continue
            end = t + p.walltime
            allowed = None
            if blocked is not None:
                allowed = lambda n, i, s, b=blocked, end=end: n != b[0] or end <= b[1]  # noqa: E731
            seen[0] += blocked is not None and end > blocked[1] and p.job.shape_id in refused
            placed = placer.place(p.job, allowed)
            if placed is None:
                if blocked is not None and end > blocked[1]:
                    refused.add(p.job.shape_id)
                if not blocked_seen:
                    blocked_seen, blocked = True, sim.shadow(p.job)
                continue
            sim.push(end, _alloc_of(p.job, *placed, t, end))
            p.started = True
            if p.interest:
                starts[p.job.job_id] = t
                if len(starts) == wanted:
                    return starts
        order = [p for p in order if not p.started]
        t = sim._advance(t, next_t0, arrivals)
        if t is None:
            break
        changed = sim._release_until(t) or changed
    return starts


def test_a_forward_scenario_starts_what_the_plain_simulation_starts() -> None:
    """ForwardSim.run skips place() for a shape the shadow already refused in the same scan
    (until something starts on the blocked node): on random busy clusters with queues of a
    few repeated shapes, every scenario starts the same jobs at the same times, on the same
    GPUs, as the plain simulation that offers every job to place() every time."""
    from apps.scheduling.policy.eta import ArrivalStream, ForwardSim, _Pending

    seen = [0]
    for seed in range(150):
        rng = random.Random(seed)
        cluster = [node(f"n{k}", gpus=rng.choice((2, 4, 8))) for k in range(rng.choice((3, 5, 8)))]
        busy = []
        for k, n in enumerate(cluster):
            free = list(range(len(n.gpus)))
            rng.shuffle(free)
            while len(free) > rng.choice((0, 0, 1)):
                size = min(rng.choice((1, 1, 2, 4)), len(free))
                taken = tuple(sorted(free.pop() for _ in range(size)))
                busy.append(running(f"r{k}-{len(busy)}", n.name, taken, left_s=rng.uniform(60, 10 * HOUR),
                                    share=rng.choice((1.0, 1.0, 0.5)) if size == 1 else 1.0))
        shapes = [rng.choice((0.5, 1, 1, 2, 4, 8)) for _ in range(3)]
        queue = [(job(f"q{i}", gpus=rng.choice(shapes), walltime_s=HOUR), rng.uniform(0.1, 10.0),
                  NOW + (rng.uniform(0, 3 * HOUR) if rng.random() < 0.2 else 0.0)) for i in range(40)]
        runs = []
        for plain in (False, True):
            pending = [_Pending((k,), j, t0, k % 3 == 0, j.walltime * f) for k, (j, f, t0) in enumerate(queue)]
            sim = ForwardSim(capacities(cluster, busy), busy, None, NOW, 2000)
            got = _plain_forward_run(sim, pending, seen) if plain else sim.run(pending, ArrivalStream.empty())
            runs.append((got, [(end, seq, a.job_id, a.node, a.gpu_indices, a.gpu_share) for end, seq, a in sim.events]))
        assert runs[0] == runs[1], seed
    assert seen[0] > 300, seen  # the shortcut's case came up often


def test_what_a_pass_keeps_for_the_next_never_answers_for_a_changed_input() -> None:
    """The only thing kept across passes is admission's never-starts memo (admission._ANSWERS,
    keyed by the schedulable nodes and the limits). Passes on one process whose inputs change
    between them — a per-job limit set and lifted, the big node drained and back, users'
    usage swapped, a job's class raised — each give the plan a fresh process (memo cleared)
    gives, and the memo stays bounded."""
    from apps.scheduling.policy import TeamPolicy, admission

    big, small = node("big", gpus=8), node("small", gpus=2)
    busy = (running("r1", "small", (0, 1), left_s=HOUR),)
    queue = (
        job("j4", gpus=4, user="ann", age_s=60.0),
        job("j1", gpus=1, user="bob", age_s=30.0),
        job("a1", gpus=1, user="ann", age_s=30.0, cls="low"),
    )
    base = ClusterState(
        nodes=(big, small), running=busy, queued=queue, config=PolicyConfig(policy="fair"),
        usage={("vision", "ann"): 100.0, ("vision", "bob"): 9000.0},
    )
    drained = dataclasses.replace(big, schedulable=False)
    raised = tuple(dataclasses.replace(j, priority_class="high") if j.job_id == "j1" else j for j in queue)
    states = [
        base,
        dataclasses.replace(base, teams={"vision": TeamPolicy(max_gpus_per_job=2)}),
        base,
        dataclasses.replace(base, nodes=(drained, small)),
        base,
        dataclasses.replace(base, usage={("vision", "ann"): 9000.0, ("vision", "bob"): 100.0}),
        dataclasses.replace(base, queued=raised),
        base,
    ]
    full = dataclasses.replace(base, running=busy + (running("r2", "big", tuple(range(8)), left_s=HOUR),))
    states += [dataclasses.replace(s, running=full.running) for s in states]
    warm = []
    for state in states:
        warm.append(plan(state, NOW))
    cold = []
    for state in states:
        admission._ANSWERS.clear()
        cold.append(plan(state, NOW))
    assert warm == cold
    reasons = {e.job_id: e.reason for e in warm[1].queue}
    assert "per-job limit is 2" in reasons["j4"]  # the limit, not the memo of pass 1
    assert {s.job_id for s in warm[2].starts} == {"j4", "j1", "a1"}  # lifted again
    # big drained: the only node that could hold it is named (not "no node can ever fit")
    assert "take no new work: big (not schedulable)" in {e.job_id: e.reason for e in warm[3].queue}["j4"]
    order = [[e.job_id for e in p.queue if e.job_id != "j4"] for p in warm[8:]]
    assert order[0] == ["a1", "j1"]  # ann's lower usage outweighs her job's lower class ...
    assert order[5] == ["j1", "a1"]  # ... until the users' usage is swapped between passes
    assert order[6] == ["j1", "a1"] and order[7] == ["a1", "j1"]  # or bob's job is raised to high, and back
    prio = [{e.job_id: e.priority for e in p.queue} for p in warm[8:]]
    assert prio[5]["a1"] < prio[0]["a1"] and prio[5]["j1"] > prio[0]["j1"]  # usage swapped between passes
    for k in range(3 * admission._ANSWERS_KEPT):  # clusters come and go: the memo stays bounded
        plan(dataclasses.replace(base, nodes=(node(f"n{k}", gpus=8),)), NOW)
    assert len(admission._ANSWERS) <= admission._ANSWERS_KEPT


def test_a_reasons_time_is_fmt_times_whatever_the_minute_and_day() -> None:
    """Explainer.fmt (the time of day by arithmetic, the date once per day) says what
    fmt_time says, near midnight, a day ahead and weeks ahead included."""
    from apps.scheduling.policy.explain import Explainer, fmt_time

    rng = random.Random(11)
    state = ClusterState(nodes=(), running=(), queued=())
    for _ in range(300):
        now = NOW + rng.uniform(-5e6, 5e6)
        for t in (now + rng.uniform(0, 86_400 * 1.5), now + rng.uniform(0, 3e6), now + 86_400 + rng.uniform(-60, 60),
                  (now // 86_400 + 1) * 86_400 + rng.uniform(-90, 90)):
            # A new explainer each time: one remembers a minute's text from the first ETA in it.
            assert Explainer(state, now, {}, (), ()).fmt(t) == fmt_time(t, now), (t, now)


def test_a_time_on_another_day_says_its_date_even_within_24_hours() -> None:
    """At 18:16, "within quota again 18:10 UTC" meant tomorrow and read as the past (manager trial 15, F11)."""
    from apps.scheduling.policy.explain import Explainer, fmt_time

    now = 1796321760.0  # 2026-12-03 18:16 UTC
    state = ClusterState(nodes=(), running=(), queued=())
    assert fmt_time(now + 3600, now) == "19:16 UTC"
    assert fmt_time(now + 86_400 - 360, now) == "2026-12-04 18:10 UTC"
    assert fmt_time(now + 6 * 3600, now) == "2026-12-04 00:16 UTC"
    assert Explainer(state, now, {}, (), ()).fmt(now + 86_400 - 360) == "2026-12-04 18:10 UTC"


def test_the_entry_loops_coarse_eta_is_eta_model_coarse() -> None:
    """Below the head, explain() computes EtaModel.coarse inline (one call per waiting job
    of a long queue): the same point and range, with and without inflow to stretch by, and
    with the head's result carried across the seam (EtaModel.carry_from) or not."""
    from apps.scheduling.policy.eta import EtaModel
    from apps.scheduling.policy.explain import Explainer, Waiting

    rng = random.Random(5)
    cluster = (node("n1", gpus=8), node("n2", gpus=4))
    busy = (running("r1", "n1", (0, 1, 2, 3, 4, 5, 6, 7), left_s=2 * HOUR), running("r2", "n2", (0, 1), left_s=HOUR))
    queued = tuple(
        job(f"q{k:03d}", user=f"u{k % 7}", gpus=rng.choice((0.5, 1, 2, 4)), age_s=rng.uniform(0, 9 * HOUR),
            walltime_s=rng.uniform(300, 6 * HOUR))
        for k in range(80)
    )
    # Enough inflow work that the load reaches the 0.9 cap for the lowest priorities.
    arrivals = tuple(job(f"a{k}", user=f"v{k}", gpus=rng.choice((1, 4)), age_s=k * 600.0, walltime_s=8 * HOUR)
                     for k in range(40))
    for inflow in ((), arrivals):
        state = ClusterState(nodes=cluster, running=busy, queued=queued, inflow=inflow,
                             config=PolicyConfig(policy="fair", eta_scenarios=0, eta_range_widen=1.5))
        caps = capacities(cluster, busy)
        fairshare = {(j.team, j.user): rng.uniform(0.1, 1.0) for j in queued + arrivals}
        model = EtaModel(state, NOW, caps, busy, None, None, fairshare)
        model.spread = (0.6, 1.7)  # what a head would have refined it to
        # Priorities on the arrivals' own scale (arrival_priority's, ~1e4: a made-up 0-5 is
        # below every arrival, so the stretch's bisect, its cap and the widening went
        # untested): above all, below all, between, and ties.
        known = sorted(-p for p in model.inflow_table()[0]) or [1.0]
        between = [(a + b) / 2 for a, b in zip(known, known[1:], strict=False)]
        choices = known + [known[0] - 1.0, known[-1] + 1.0] + between
        factors = (0.1, 0.2, 0.3, 0.4)
        waiting = [Waiting(j, "resources", "", None, "medium", Ranked(choices[k % len(choices)], j, "medium", factors))
                   for k, j in enumerate(queued)]
        explainer = Explainer(state, NOW, caps, (), ())
        pooled, _ = explainer.pooled_etas(waiting)
        # no head (eta_scenarios 0): the carry across the seam as set here (none; ratios for
        # one shape, offsets for another, none for the rest)
        shapes = sorted({j.shape_id for j in queued})
        ratios, offsets = ((1.3, 0.0), (1.7, 0.0), (1.1, 0.0)), ((1.0, 600.0), (1.2, 0.0), (1.0, 90.5))
        for carry in ({}, {shapes[0]: ratios, shapes[-1]: offsets}):
            model.carry = carry
            entries, _ = explainer.explain(waiting, {}, model)
            for w, eta, entry in zip(waiting, pooled, entries, strict=True):
                want = model.coarse(eta, w.row[0], w.job.shape_id)
                got = (entry.estimated_start, entry.estimated_start_low, entry.estimated_start_high)
                assert got == want, (inflow != (), carry, w.job.job_id)
            assert any(e.estimated_start > NOW for e in entries)


def _explain_setup(seed: int, history: tuple = ()):
    """A small busy cluster, 80 waiting jobs of mixed sizes and their Waiting records."""
    from apps.scheduling.policy.explain import Explainer, Waiting

    rng = random.Random(seed)
    cluster = (node("n1", gpus=8), node("n2", gpus=4))
    busy = (running("r1", "n1", (0, 1, 2, 3, 4, 5, 6, 7), left_s=2 * HOUR), running("r2", "n2", (0, 1), left_s=HOUR))
    queued = tuple(
        job(f"q{k:03d}", user=f"u{k % 7}", gpus=rng.choice((0.25, 0.5, 1, 2, 4, 8)), age_s=rng.uniform(0, 9 * HOUR),
            walltime_s=rng.uniform(60, 6 * HOUR))
        for k in range(80)
    )
    state = ClusterState(nodes=cluster, running=busy, queued=queued, eta_history=history,
                         config=PolicyConfig(policy="fair", eta_scenarios=0))
    caps = capacities(cluster, busy)
    waiting = [Waiting(j, "resources", "", None, "medium", Ranked(1.0 - k / 100, j, "medium", (0.1, 0.2, 0.3, 0.4)))
               for k, j in enumerate(queued)]
    return state, caps, busy, waiting, Explainer(state, NOW, caps, (), ())


def test_the_entry_loops_common_reason_is_waiting_text() -> None:
    """explain() builds the common reason inline ("behind N higher-priority jobs (M of other
    teams); waiting for …; expected …"): waiting_text()'s text for every entry of a queue
    of four teams."""
    from apps.scheduling.policy.explain import Explainer, Waiting

    state, caps, busy, waiting, _ = _explain_setup(4)
    teams = ("vision", "robotics", "nlp", "audio")
    waiting = [Waiting(dataclasses.replace(w.job, team=teams[k % 7 % 4]), w.kind, w.note, w.until, w.cls, w.row)
               for k, w in enumerate(waiting)]
    explainer = Explainer(state, NOW, caps, (), ())
    entries, _ = explainer.explain(waiting, {}, None)
    inline = 0
    for k, (w, entry) in enumerate(zip(waiting, entries, strict=True)):
        others = sum(v.job.team != w.job.team for v in waiting[:k])
        assert entry.reason == explainer.waiting_text(w.job, k, entry.estimated_start, others), entry.job_id
        inline += others > 1
    assert inline > 50


def test_the_entry_loops_calibration_is_calibrate() -> None:
    """With a track record, explain() calibrates every ETA inline: Calibration.calibrate's
    point and range for every entry, its model point kept, in every bucket of predicted wait
    (and without a model, on the pooled sweep's point alone)."""
    from bisect import bisect_right

    from apps.scheduling.policy.eta import EtaModel
    from apps.scheduling.policy.eta_calibration import EDGES_S, calibration_for

    rng = random.Random(9)
    history = tuple((rng.expovariate(1 / 20000), rng.expovariate(1 / 20000) * rng.uniform(0.3, 3.0))
                    for _ in range(400))
    state, caps, busy, waiting, explainer = _explain_setup(3, history)
    calibration = calibration_for(history, state.config.eta_coverage, state.config.eta_calibration_min)
    assert calibration is not None
    model = EtaModel(state, NOW, caps, busy, None, None, {})
    for eta_model in (model, None):
        entries, _ = explainer.explain(waiting, {}, eta_model)
        buckets = set()
        for entry in entries:
            point = entry.estimated_start_model
            assert point is not None
            got = (entry.estimated_start, entry.estimated_start_low, entry.estimated_start_high)
            assert got == calibration.calibrate(NOW, point), entry.job_id
            buckets.add(bisect_right(EDGES_S, max(0.0, point - NOW)))
        assert len(buckets) >= 4, buckets


def test_the_entry_loops_calibration_clamps_a_pooled_bucket_as_calibrate_does() -> None:
    """The inlined copy of Calibration.calibrate clamps a bucket on the pooled interval between its
    neighbours (Calibration.clamps), as calibrate does: with the random history above no clamp
    changed any entry, so the inlined clamp could be left out and that test still passed (review27).
    Here the buckets between 10 min and 2.5 days disagree (starts 0.2x to 12x the prediction) and the
    first and last buckets, with no records of their own, are clamped."""
    import copy

    from apps.scheduling.policy.eta import EtaModel
    from apps.scheduling.policy.eta_calibration import EDGES_S, calibration_for

    rng = random.Random(0)
    history: list[tuple[float, float]] = []
    for b in range(1, len(EDGES_S)):
        factor, mid = rng.choice((0.2, 1.0, 4.0, 12.0)), (EDGES_S[b - 1] + EDGES_S[b]) / 2
        history += [(mid, mid * factor * rng.uniform(0.9, 1.1)) for _ in range(40)]
    state, caps, busy, waiting, explainer = _explain_setup(3, tuple(history))
    calibration = calibration_for(tuple(history), state.config.eta_coverage, state.config.eta_calibration_min)
    assert calibration is not None
    unclamped = copy.copy(calibration)
    unclamped.clamps = [None] * len(calibration.clamps)
    entries, _ = explainer.explain(waiting, {}, EtaModel(state, NOW, caps, busy, None, None, {}))
    clamped = 0
    for entry in entries:
        point = entry.estimated_start_model
        got = (entry.estimated_start, entry.estimated_start_low, entry.estimated_start_high)
        assert got == calibration.calibrate(NOW, point), entry.job_id
        clamped += got != unclamped.calibrate(NOW, point)
    assert clamped >= 5  # the clamp decides these entries


def test_a_forward_scenarios_allocation_is_an_allocation_with_every_field() -> None:
    from apps.scheduling.policy import Allocation
    from apps.scheduling.policy.eta import _alloc_of

    j = job("j1", gpus=2, team="vision", user="ann")
    fast = _alloc_of(j, "n1", (0, 1), 1.0, NOW, NOW + HOUR)
    plain = Allocation(j.job_id, j.team, j.user, "n1", (0, 1), 1.0, j.gpu_memory_mb, j.cpu_milli, j.memory_mb, "",
                       NOW, NOW + HOUR)
    assert type(fast) is Allocation
    assert fast == plain and vars(fast) == vars(plain)
    assert [f.name for f in dataclasses.fields(Allocation)] == list(vars(fast))


def test_arrival_priorities_are_the_plain_formula() -> None:
    """The ETAs weigh each recent arrival with arrival_priorities() (size factor inline): the
    plain sum of weighted fair-share, size and class factors, urgent counted as high, a size
    past the cap counted as 0."""
    from apps.scheduling.policy.priority import CLASS_FACTOR, arrival_priorities, size_factor

    rng = random.Random(11)
    config = PolicyConfig(policy="fair")
    jobs = [
        job(f"a{k}", user=f"u{k % 5}", gpus=rng.choice((0.25, 1, 2, 8, 64)),
            cls=rng.choice(("low", "medium", "high", "urgent")), walltime_s=rng.choice((60.0, 3600.0, 30 * 86400.0)))
        for k in range(200)
    ]
    fairshare = {("vision", f"u{k}"): rng.random() for k in range(4)}  # u4 has none: 1.0
    plain = [
        config.weight_fairshare * fairshare.get((j.team, j.user), 1.0)
        + config.weight_size * size_factor(j, config)
        + config.weight_class * CLASS_FACTOR["high" if j.priority_class == "urgent" else j.priority_class]
        for j in jobs
    ]
    assert arrival_priorities(jobs, fairshare, config) == plain
    assert any(size_factor(j, config) == 0.0 for j in jobs)


def test_the_carry_across_the_seam_keeps_the_last_head_job_and_caps_the_ratio() -> None:
    """EtaModel.carry_from: the head's last job, coarse again, is shown at its forward range;
    below it a wait is multiplied by at most CARRY_RATIO_MAX (a shape the sweep starts at once
    and the scenarios hours later: a 2,250x ratio multiplied every wait below), the rest of
    the excess added; a forward range earlier than the coarse one carries nothing; a coarse
    wait of 0 carries the forward wait as an offset; another shape carries nothing. Never
    earlier than the coarse estimate."""
    import pytest

    from apps.scheduling.policy.eta import CARRY_RATIO_MAX, EtaModel

    cluster = (node("n1", gpus=4),)
    state = ClusterState(nodes=cluster, config=PolicyConfig(policy="fair"))
    model = EtaModel(state, NOW, capacities(cluster, ()), (), None, None, {})
    model.spread = (0.5, 2.0)
    forward = (NOW + 36_000.0, NOW + 30_000.0, NOW + 40_000.0)
    model.carry_from(forward, NOW + 16.0, 0.0, 7)
    assert model.coarse(NOW + 16.0, 0.0, 7) == pytest.approx(forward, rel=1e-12)
    below = model.coarse(NOW + 3600.0, 0.0, 7)
    alone = (NOW + 3600.0, NOW + 1800.0, NOW + 7200.0)
    assert below[0] == pytest.approx(NOW + 3600.0 * CARRY_RATIO_MAX + 36_000.0 - 16.0 * CARRY_RATIO_MAX)
    assert all(b >= a and b >= f for a, b, f in zip(alone, below, forward, strict=True))
    model.carry_from((NOW + 10.0, NOW + 5.0, NOW + 20.0), NOW + 16.0, 0.0, 7)  # forward earlier: no carry
    assert model.coarse(NOW + 3600.0, 0.0, 7) == alone
    model.carry_from((NOW + 1500.0, NOW + 600.0, NOW + 2600.0), NOW + 1000.0, 0.0, 7)  # within the cap: ratios
    assert model.coarse(NOW + 3600.0, 0.0, 7) == pytest.approx((NOW + 5400.0, NOW + 2160.0, NOW + 9360.0), rel=1e-12)
    model.carry_from((NOW + 900.0, NOW + 600.0, NOW + 1500.0), NOW, 0.0, 7)  # coarse wait 0: an offset
    assert model.coarse(NOW + 3600.0, 0.0, 7) == (NOW + 4500.0, NOW + 2400.0, NOW + 8700.0)
    assert model.coarse(NOW + 3600.0, 0.0, 8) == model.coarse(NOW + 3600.0, 0.0) == alone  # another shape: none
