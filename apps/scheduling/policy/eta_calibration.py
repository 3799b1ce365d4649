"""ETA ranges calibrated on the scheduler's own track record (split-conformal style).

The forward simulation's P10-P90 (:mod:`.eta`) varies runtimes and inflow but not the
*order* a burst's later arrivals and long jobs impose, so on the trace its ranges held
the actual start for only 10-18 % of the jobs that waited, mostly too early. Instead of
trusting the scenarios' spread, the range is set from how the first point ETAs of
recently started jobs compared with their actual starts:

- ``ClusterState.eta_history`` holds ``(predicted wait, actual wait)`` in seconds for
  jobs that waited and have **started** (their first start), oldest first — the past
  only: the simulator appends a job when it starts, the live scheduler reads
  ``predicted_model_start_at`` (the model's first point) and ``first_started_at`` from the jobs.
  The prediction is the model's *uncalibrated* point (``QueueEntry.estimated_start_model``;
  live ``Job.predicted_model_start_at``), so calibration does not feed on itself.
- Each record is a score ``log((actual + c) / (predicted + c))`` (``c`` =
  :data:`OFFSET_S`, so a near-zero prediction still has a ratio), kept in a bucket by the
  predicted wait's magnitude (:data:`EDGES_S`): an ETA of minutes and one of days are
  wrong in different ways.
- A new prediction ``p`` in bucket ``b`` gets the **shortest** interval of scores that
  holds ``ceil(coverage × (n + 1))`` of the bucket's ``n`` records (split conformal's
  finite-sample rank; shortest rather than the central P10-P90, because the scores are
  skewed and the width target counts), mapped back: ``low = (p + c)·e^lo − c``,
  ``high = (p + c)·e^hi − c`` (never before now). A bucket with fewer than
  ``config.eta_calibration_min`` records uses all records; with fewer than that in all,
  the forward simulation's range stands. A bucket on the pooled interval does not bound the
  others (below); it is kept between the buckets with records of their own (:meth:`Calibration._clamps`).
- The point shown becomes the bucket's **median** score applied the same way (the best
  constant for the absolute error, and always inside the range); the model's own point
  is kept beside it (``QueueEntry.estimated_start_model``) for the record.
- The map is kept monotone in the predicted wait across the buckets' edges
  (:meth:`Calibration._bounds`), so jobs that cannot overtake each other are shown in order.

Coverage holds where the process is roughly stationary over the history (the last
:data:`HISTORY_N` starts within :data:`HISTORY_S`); a burst that makes waits jump is
learned only as its jobs start (jobs still waiting are not in the record: the censored
long waits make the range somewhat too early while a burst builds up).

The top bucket (predicted >= 2.5 days) applies its ratio to points far beyond its records (the
few below-head points of 40-350 days). Bounding it by the record itself does not work: the
record's largest wait is censored the same way (median 5-9 days on the replays while waits
built up), so a cap at 1.5x it collapsed 14-59 % of the top bucket's ranges to an instant and
raised gpuspec10's point error 9.5 %; clamping the predicted wait at the bucket's largest
recorded prediction raised 4x8's 0.7-3.7 % (docs/scheduling.md, "A calibration top bucket that
does not extrapolate").
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

from .types import DAY_S

# Bucket edges on the predicted wait (s): < 10 min, < 1 h, < 4 h, < 16 h, < 2.5 days, longer.
EDGES_S = (600.0, 3600.0, 4 * 3600.0, 16 * 3600.0, 2.5 * DAY_S)
OFFSET_S = 4 * 3600.0  # c in log((actual + c) / (predicted + c)); tuned on the tuning seeds (docs)
HISTORY_N = 3000  # the newest this many started jobs ...
HISTORY_S = 14 * DAY_S  # ... that started within this long (both chosen on the tuning seeds: docs)
HISTORY_MAX_WAIT_S = 30 * DAY_S  # ... after waiting at most this long (bounds the live query)


def score(predicted_wait: float, actual_wait: float) -> float:
    return math.log((max(0.0, actual_wait) + OFFSET_S) / (max(0.0, predicted_wait) + OFFSET_S))


def _shortest(sorted_scores: Sequence[float], k: int) -> tuple[float, float]:
    """The narrowest (lo, hi) among windows of ``k`` consecutive sorted scores."""
    n = len(sorted_scores)
    if k >= n:
        return sorted_scores[0], sorted_scores[-1]
    best = min(range(n - k + 1), key=lambda i: (sorted_scores[i + k - 1] - sorted_scores[i], i))
    return sorted_scores[best], sorted_scores[best + k - 1]


class Calibration:
    """Per-bucket score (median, low, high) from a history of (predicted wait, actual wait)."""

    def __init__(self, history: Sequence[tuple[float, float]], coverage: float, min_records: int) -> None:
        by_bucket: list[list[float]] = [[] for _ in range(len(EDGES_S) + 1)]
        pooled: list[float] = []
        log, bucket_of, offset = math.log, bisect.bisect_right, OFFSET_S
        for predicted, actual in history[-HISTORY_N:]:
            # score() inlined: the record is read every pass
            s = log(((actual if actual > 0.0 else 0.0) + offset) / ((predicted if predicted > 0.0 else 0.0) + offset))
            by_bucket[bucket_of(EDGES_S, predicted)].append(s)
            pooled.append(s)
        enough = max(1, min_records)
        # All records together, for the buckets with too few of their own (only then: the
        # record is read every pass, and a full one fills every bucket)
        fallback = None
        if len(pooled) >= enough and any(len(b) < enough for b in by_bucket):
            fallback = self._interval(pooled, coverage)
        self.intervals: list[tuple[float, float, float] | None] = [
            self._interval(b, coverage) if len(b) >= enough else fallback for b in by_bucket
        ]
        # e**score of each, once: calibrate() runs for every waiting job every pass (the queue
        # entry loop, Explainer.explain, does its arithmetic inline on these)
        self.factors: list[tuple[float, float, float] | None] = [
            None if got is None else tuple(math.exp(s) for s in got) for got in self.intervals
        ]
        # Which buckets have records enough of their own (the others show the pooled interval)
        own = [len(b) >= enough for b in by_bucket]
        self.bounds = self._bounds(self.factors, own)
        self.clamps = self._clamps(self.factors, own)

    @staticmethod
    def _bounds(
        factors: Sequence[tuple[float, float, float] | None], own: Sequence[bool] | None = None
    ) -> list[tuple[float, float, float]]:
        """Per bucket, (the least point wait, the most low wait, the least high wait) it may
        show, so that the whole map is monotone in the predicted wait.

        Each bucket maps its own predictions in order, but the buckets learn different errors,
        so at an edge a longer predicted wait could be shown as an earlier start: a bucket
        saying "late" below one saying "early" put positions 3 and 4 of a one-GPU queue before
        positions 1 and 2 (trial25 F1). So the point and the range's high end are never below
        what a lower bucket's map reaches at its upper edge, and the low end never above what a
        higher bucket's map gives at its lower edge. A range is only ever widened by this, so no
        start it held is lost; capping the high end instead (narrower) lost coverage on held-out
        replays (docs/scheduling.md, "ETA calibration on the track record"). A bucket whose
        neighbours agree with it is its own map unchanged.

        Only buckets with records enough of their ``own`` (all, where not given) bound others:
        a bucket on the pooled interval is kept between them instead (:meth:`_clamps`). The
        pooled interval mixes every bucket's errors, so its high end is wide, and as a floor
        at its upper edge it raised every longer prediction's high end to weeks: half of the
        width over the mean wait on the 4x8 replays (docs/scheduling.md, "Where the ETA
        ranges' width comes from").
        """
        inf = math.inf
        n = len(factors)
        own = own if own is not None else [True] * n
        floor, hi_floor, floors = -inf, -inf, []
        for k, got in enumerate(factors):
            floors.append((floor, hi_floor))
            if got is not None and own[k] and k < len(EDGES_S):
                edge = EDGES_S[k] + OFFSET_S
                floor, hi_floor = max(floor, edge * got[0] - OFFSET_S), max(hi_floor, edge * got[2] - OFFSET_S)
        lo_cap, caps = inf, [inf] * n
        for k in range(n - 1, -1, -1):
            caps[k] = lo_cap
            got = factors[k]
            if got is not None and own[k] and k > 0:
                lo_cap = min(lo_cap, (EDGES_S[k - 1] + OFFSET_S) * got[1] - OFFSET_S)
        return [(floors[k][0], caps[k], floors[k][1]) for k in range(n)]

    @staticmethod
    def _clamps(
        factors: Sequence[tuple[float, float, float] | None], own: Sequence[bool]
    ) -> list[tuple[float, float, float] | None]:
        """Per bucket on the pooled interval, (the most point wait, the least low wait, the most
        high wait) it may show before :meth:`_bounds` applies: its point and high end no later
        than any bucket above with records of its own shows at that bucket's lower edge, its low
        end no earlier than any such bucket below shows at its upper edge. None for a bucket with
        records of its own (its map is bounded by :meth:`_bounds` alone).

        So the map stays monotone: a bucket with records of its own starts at or above these
        caps and ends at or below these floors, and a run of pooled buckets is one map (the same
        factors) clamped by the same values. And low <= point <= high still holds: the floors
        and caps are the neighbours' own (low <= point <= high) values at their edges.
        """
        inf = math.inf
        n = len(factors)
        out: list[tuple[float, float, float] | None] = [None] * n
        for k in range(n):
            if own[k] or factors[k] is None:
                continue
            most_mid = most_hi = inf
            least_lo = -inf
            for j in range(n):
                got = factors[j]
                if got is None or not own[j] or j == k:
                    continue
                if j > k:
                    edge = EDGES_S[j - 1] + OFFSET_S
                    most_mid = min(most_mid, edge * got[0] - OFFSET_S)
                    most_hi = min(most_hi, edge * got[2] - OFFSET_S)
                else:
                    least_lo = max(least_lo, (EDGES_S[j] + OFFSET_S) * got[1] - OFFSET_S)
            if most_mid < inf or most_hi < inf or least_lo > -inf:
                out[k] = (most_mid, least_lo, most_hi)
        return out

    @staticmethod
    def _interval(scores: list[float], coverage: float) -> tuple[float, float, float]:
        scores = sorted(scores)
        k = min(len(scores), max(1, math.ceil(coverage * (len(scores) + 1))))
        lo, hi = _shortest(scores, k)
        n = len(scores)
        median = (scores[(n - 1) // 2] + scores[n // 2]) / 2
        return min(max(median, lo), hi), lo, hi

    def calibrate(self, now: float, point: float) -> tuple[float, float, float] | None:
        """(point, low, high) for a job whose model ETA is ``point``; None = too little history.

        The point is the bucket's median score applied to the model's point (the absolute
        error's best constant; inside the range), the range its shortest interval; both kept
        monotone in the predicted wait across the buckets' edges (:meth:`_bounds`).
        """
        predicted = point - now  # max(0.0, …) here and below, without the calls
        if not predicted > 0.0:
            predicted = 0.0
        bucket = bisect.bisect_right(EDGES_S, predicted)
        got = self.factors[bucket]
        if got is None:
            return None
        offset = OFFSET_S
        base = predicted + offset
        f_mid, f_lo, f_hi = got
        mid, lo, hi = base * f_mid - offset, base * f_lo - offset, base * f_hi - offset
        clamp = self.clamps[bucket]  # a bucket on the pooled interval: between its neighbours
        if clamp is not None:
            most_mid, least_lo, most_hi = clamp
            if mid > most_mid:
                mid = most_mid
            if lo < least_lo:
                lo = least_lo
            if hi > most_hi:
                hi = most_hi
        least, most_lo, least_hi = self.bounds[bucket]  # monotone across the buckets' edges
        if mid < least:
            mid = least
        if lo > most_lo:
            lo = most_lo
        if hi < least_hi:
            hi = least_hi
        # Still low <= point <= high, with no clamp: the bucket's own factors are in order
        # (_interval), lowering low and raising point and high keep point >= low, and the
        # least point is a lower bucket's point at its edge, never above that bucket's high
        # there, which bounds least_hi (a random-history test holds it over many records).
        return (now + (mid if mid > 0.0 else 0.0), now + (lo if lo > 0.0 else 0.0), now + (hi if hi > 0.0 else 0.0))


def calibration_for(history: Sequence[tuple[float, float]], coverage: float, min_records: int) -> Calibration | None:
    """A calibration where it is switched on (``coverage > 0``) and some history exists."""
    if coverage <= 0 or len(history) < max(1, min_records):
        return None
    return Calibration(history, coverage, min_records)
