"""Usage accounting helpers shared by the live system and the simulator.

Both are pure and clock-free: every method takes the time it is asked about.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable

from .types import DAY_S


class DecayedUsage:
    """GPU-seconds per key, decayed with a half-life (Slurm ``PriorityDecayHalfLife``).

    A charge of ``u`` GPU-seconds made at time ``t`` is worth ``u * 2 ** (-(now - t) / half_life)``
    at ``now``. Each key stores one value and the time it was last decayed to, so adding
    and reading are O(1). Charges must come in non-decreasing time order per key (a charge
    in the past is treated as made at the key's current time).

    >>> u = DecayedUsage(half_life_s=3600)
    >>> u.add(("team-a", "ann"), 7200, at=0)
    >>> round(u.value(("team-a", "ann"), now=3600))
    3600
    """

    def __init__(self, half_life_s: float) -> None:
        if not half_life_s or half_life_s <= 0:
            raise ValueError("half_life_s must be > 0: a zero half-life would switch fair-share off")
        self.half_life_s = float(half_life_s)
        self._rate = math.log(2) / self.half_life_s
        self._values: dict[Hashable, tuple[float, float]] = {}

    def _decayed(self, key: Hashable, now: float) -> float:
        value, at = self._values.get(key, (0.0, now))
        if now <= at:
            return value
        return value * math.exp(-self._rate * (now - at))

    def add(self, key: Hashable, gpu_seconds: float, at: float) -> None:
        value = self._decayed(key, at)
        last = self._values.get(key, (0.0, at))[1]
        self._values[key] = (value + gpu_seconds, max(at, last))

    def value(self, key: Hashable, now: float) -> float:
        return self._decayed(key, now)

    def snapshot(self, now: float) -> dict[Hashable, float]:
        """Every key's value decayed to ``now`` (what ``ClusterState.usage`` wants)."""
        return {key: self._decayed(key, now) for key in self._values}


class RollingUsage:
    """GPU-seconds per key in a rolling window (default 24 h), in time buckets.

    Usage is charged to the bucket of the time it was consumed (``bucket_s``, default 5 min),
    so ``total`` is exact to one bucket. ``expiries`` says when each bucket leaves the window,
    which is what the policy needs to tell an over-quota user *until when*.
    """

    def __init__(self, window_s: float = DAY_S, bucket_s: float = 300.0) -> None:
        self.window_s = float(window_s)
        self.bucket_s = float(bucket_s)
        self._buckets: dict[Hashable, deque[list[float]]] = {}

    def add(self, key: Hashable, gpu_seconds: float, at: float) -> None:
        start = math.floor(at / self.bucket_s) * self.bucket_s
        buckets = self._buckets.setdefault(key, deque())
        if buckets and buckets[-1][0] == start:
            buckets[-1][1] += gpu_seconds
        elif buckets and buckets[-1][0] > start:
            buckets[-1][1] += gpu_seconds  # late charge: keep order, count it in the newest bucket
        else:
            buckets.append([start, gpu_seconds])

    def _trim(self, key: Hashable, now: float) -> deque[list[float]]:
        buckets = self._buckets.get(key)
        if buckets is None:
            return deque()
        while buckets and buckets[0][0] + self.bucket_s + self.window_s <= now:
            buckets.popleft()
        return buckets

    def total(self, key: Hashable, now: float) -> float:
        return sum(amount for _, amount in self._trim(key, now))

    def expiries(self, key: Hashable, now: float) -> tuple[tuple[float, float], ...]:
        """``(time it leaves the window, gpu_seconds)`` for each bucket still in the window."""
        return tuple((start + self.bucket_s + self.window_s, amount) for start, amount in self._trim(key, now))

    def keys(self) -> list[Hashable]:
        return list(self._buckets)
