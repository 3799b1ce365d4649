"""The scheduling policy: pure, deterministic, no Django or Redis imports.

``plan(state, now)`` is the only entry point the live scheduler and the simulator use;
``state.config.policy`` picks ``fifo`` (the baseline) or ``fair``.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator

from .admission import admission_error
from .fair import plan_fair
from .fifo import plan_fifo
from .placement import fits_empty_cluster
from .types import (
    DAY_S,
    DEFAULT_RUNTIME_S,
    PRIORITY_CLASSES,
    Allocation,
    ClusterState,
    GpuInfo,
    JobRequest,
    NodeInfo,
    Plan,
    PolicyConfig,
    Preemption,
    QueueEntry,
    Start,
    TeamPolicy,
    runtime_limit,
)
from .usage import DecayedUsage, RollingUsage

POLICIES: dict[str, Callable[[ClusterState, float], Plan]] = {"fifo": plan_fifo, "fair": plan_fair}

__all__ = [
    "DAY_S",
    "DEFAULT_RUNTIME_S",
    "PRIORITY_CLASSES",
    "POLICIES",
    "Allocation",
    "ClusterState",
    "DecayedUsage",
    "GpuInfo",
    "JobRequest",
    "NodeInfo",
    "Plan",
    "PolicyConfig",
    "Preemption",
    "QueueEntry",
    "RollingUsage",
    "Start",
    "TeamPolicy",
    "admission_error",
    "fits_empty_cluster",
    "gc_paused",
    "plan",
    "runtime_limit",
]


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused inside (restored as it was).

    A planning pass allocates a few objects per queued job (rows, holds, queue entries; the
    live pass also model rows and requests), so with a long queue CPython ran several full
    collections per pass, each walking every live object: ~40 % of the policy's pass at
    100,000 queued; at 10,000 queued the live pass (``loop.plan_and_start``,
    bench/live_pass.py's database) took 2.62 s of CPU with the collector and 2.39 s
    without (medians of 3, alternated). A pass makes no reference cycles it drops (its
    objects are freed by reference counting as usual); anything cyclic would wait for the
    next collection.
    """
    enabled = gc.isenabled()
    if enabled:
        gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def plan(state: ClusterState, now: float) -> Plan:
    """One planning pass: what to start, what to preempt, and every waiting job's place
    (with the cyclic garbage collector paused: :func:`gc_paused`)."""
    with gc_paused():
        return POLICIES[state.config.policy](state, now)
