"""The planning pass's shortcuts give exactly what the plain code gave (docs/scheduling.md,
"Determinism and speed"): each is checked against the straightforward version here; the
property tests check whole plans."""

from __future__ import annotations

import dataclasses
import gc
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
