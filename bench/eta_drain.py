"""A long waiter's point from its shape's drain rate, scored offline on saved ETA records (issue 14).

    python bench/eta_drain.py --records s59.json                       # main and the default candidate
    python bench/eta_drain.py --records s59.json --candidate 0.75:60:3 --candidate 0.5:60:1
    python bench/eta_drain.py --records s59.json --candidate 0.75:60:1:0.90   # and the calibration at level 0.90

The ranges are wide because of the jobs the model predicts to wait days (docs/scheduling.md,
"Where the ETA ranges' width comes from"), and the model's point for them carries little
(correlation of log point and log wait 0.27-0.44). This asks whether what decides such a wait —
how many jobs of the same shape are queued and how fast that shape has been starting — gives a
better point, so the calibration can centre the range instead of widening it.

Candidate ``w:T:W`` (``w`` the model's weight, ``T`` hours, ``W`` days): a waiting job whose model
point is more than ``T`` hours away gets, in log((wait + c) / c) scale, ``w`` x the model's wait
plus ``1 - w`` x its shape's drain estimate: (jobs of its shape waiting at its submit + 1) x ``W``
/ (jobs of that shape that started in the ``W`` before its submit), at most 60 days. Shape = the
GPU class of ``eta_calibration._shape`` and whether GPU models are constrained. Everything used
is known at the job's submit (earlier submits and starts only); the record keeps the new point,
as it would if the model gave it (calibration moves no start, so the records are still valid).
Scored by ``eta_calibration.evaluate`` (main's Calibration, ``cal.OFFSET_S``, level 0.88 or the
candidate's optional fourth field ``L``), with the
long waiters (waited >= 7 days) whose start the shown range held. Offline only: no setting.
Measured (docs/scheduling.md, "The long waiters' point from their shape's drain rate"): narrower and
mostly a lower error, but it failed its held-out rule twice (coverage on 4x8 s67; at level 0.89 the
point error on s89) and loses the multi-week waiters, whom the drain rate does not tell apart.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
from collections import defaultdict, deque

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import apps.scheduling.policy.eta_calibration as cal  # noqa: E402
from bench.eta_calibration import _shape, evaluate  # noqa: E402

DAY_S = 86400.0
DRAIN_MAX_S = 60 * DAY_S
LONG_WAIT_S = 7 * DAY_S
MAIN_LEVEL = 0.88  # PolicyConfig().eta_coverage, as bench/eta_calibration.py's default row


def shape_of(record: list) -> tuple[str, bool]:
    return (_shape(record[6]), bool(record[7]))


def drain_counts(records: list, window_s: float) -> dict[int, tuple[int, int]]:
    """Per record index: (jobs of its shape waiting just before its submit, that shape's starts in
    the ``window_s`` before it). Starts at the submit's own time count as before it; a job started in
    its submit pass never waited."""
    events = []
    for i, r in enumerate(records):
        events.append((r[0], 1, i))
        if r[4] is not None:
            events.append((r[4], 0, i))
    events.sort()
    waiting: dict = defaultdict(int)
    starts: dict = defaultdict(deque)
    out = {}
    for t, is_submit, i in events:
        r = records[i]
        s = shape_of(r)
        if not is_submit:
            if r[4] > r[0]:
                waiting[s] -= 1
            starts[s].append(t)
            continue
        q = starts[s]
        while q and q[0] < t - window_s:
            q.popleft()
        out[i] = (waiting[s], len(q))
        if r[4] is None or r[4] > r[0]:
            waiting[s] += 1
    return out


def with_drain_points(data: dict, weight: float, threshold_s: float, window_s: float) -> tuple[dict, int]:
    """A copy of ``data`` whose waiting jobs predicted over ``threshold_s`` have the blended point."""
    out = copy.deepcopy(data)
    recs = out["records"]
    counts = drain_counts(recs, window_s)
    c = cal.OFFSET_S
    changed = 0
    for i, r in enumerate(recs):
        if r[1] is None or (r[4] is not None and r[4] == r[0]):
            continue
        predicted = max(0.0, r[1] - r[0])
        if predicted <= threshold_s:
            continue
        queued, started = counts[i]
        drain = min(DRAIN_MAX_S, (queued + 1) * window_s / max(started, 1))
        r[1] = r[0] + max(0.0, math.exp(weight * math.log(predicted + c) + (1 - weight) * math.log(drain + c)) - c)
        changed += 1
    return out, changed


def score(data: dict, level: float = MAIN_LEVEL) -> dict:
    e = evaluate(data, cal.OFFSET_S, level)
    longs = [r for r in data["records"] if r[4] is not None and r[5] and r[4] - r[0] >= LONG_WAIT_S]
    held = sum(1 for rec, lo, hi, _ in e["details"] if rec[4] - rec[0] >= LONG_WAIT_S and lo - 1 <= rec[4] <= hi + 1)
    e["long_held"], e["long_n"] = held, len(longs)
    return e


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", required=True, help="records saved by bench/eta_calibration.py --save")
    parser.add_argument("--candidate", action="append", help="w:T_hours:W_days[:level] (default 0.75:60:1)")
    args = parser.parse_args(argv)
    with open(args.records) as fh:
        data = json.load(fh)
    mean_wait = data["metrics"]["mean_wait_s"]
    print(f"records of the replay {data.get('replay')}; mean wait {mean_wait:,.0f} s")
    print(
        "| point | coverage | waited | late | width / mean wait | MAE s | model MAE s | waited >= 7 d: range held | changed |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    candidates = []
    for name in args.candidate or ["0.75:60:1"]:
        try:
            w, t, win, *level = (float(x) for x in name.split(":"))
            if len(level) > 1:
                raise ValueError
        except ValueError:
            parser.error(f"--candidate {name!r}: expected w:T_hours:W_days[:level], e.g. 0.75:60:1 or 0.75:60:1:0.9")
        candidates.append((name, (w, t * 3600, win * DAY_S), level[0] if level else MAIN_LEVEL))
    for name, setting, level in [("main", None, MAIN_LEVEL), *candidates]:
        scored, changed = with_drain_points(data, *setting) if setting else (data, 0)
        e = score(scored, level)
        print(
            f"| {name} | {e['coverage']:.3f} | {e['coverage_waiting']:.3f} | {e['late']:.3f} | "
            f"{e['width_s'] / mean_wait:.3f} | {e['mae_s']:,.0f} | {e['mae_model_s']:,.0f} | "
            f"{e['long_held']} of {e['long_n']} | {changed} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
