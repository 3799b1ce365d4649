"""ETA calibration on the track record, replayed offline on one simulator run's per-job records.

    python bench/eta_calibration.py --trace ../shared/traces/openb_pod_list_default.csv --nodes 4x8 \
        --load 0.95 --seed 1 --save s1.json            # one replay (shipped defaults), records saved
        ... --scenarios 3 --save s1-3.json             # the same with 3 forward-ETA scenarios
        ... --scenarios 3 --eta-head 64 --save s1-3-64.json  # and the first 64 waiting jobs forward-simulated
    python bench/eta_calibration.py --records s1.json --offset 3600,14400 --level 0.8,0.88
    python bench/eta_calibration.py --records s1.json --history 1000:7,3000:14   # track records: newest N within DAYS

Calibration changes no start and the record holds the model's point (never a calibrated
one), so one replay's records — submit, the model's first point ETA, first start — are
enough to replay the online calibration exactly for any offset c and level: at each
submit, the record = jobs that waited and first started before it (newest ``HISTORY_N``
within ``HISTORY_S``, waits up to ``HISTORY_MAX_WAIT_S``), as the simulator hands the
policy. Prints coverage (all jobs, jobs that waited), the share of waiting jobs that
started before the low / after the high end, mean width against the mean wait, and the
point's MAE before and after. Used to tune on the tuning seeds (docs/scheduling.md).
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import os
import sys
from collections import deque

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import apps.scheduling.policy.eta_calibration as cal  # noqa: E402
import apps.scheduling.simulator as sim  # noqa: E402
from apps.scheduling.policy import PolicyConfig  # noqa: E402


def replay(args) -> dict:
    """One simulator run; per-job records [submit, model point, low, high (as given), first start,
    finished?, GPUs, GPU models constrained?, priority class, queue position when the ETA was given]
    (the last four for conditioning studies)."""
    tasks, _ = sim.load_trace(args.trace)
    tasks = tasks[: args.max_tasks] if args.max_tasks else tasks
    nodes = sim.load_nodes(args.nodes)
    gpus = float(sum(len(n.gpus) for n in nodes))
    tasks = sim.rescale(tasks, gpus, args.load)
    owners = sim.assign_users(len(tasks), args.seed, 40, 6, 1.1)
    jobs: dict = {}
    metrics_of = sim._metrics

    def keep(j, *a, **k):  # the per-job records the metrics are computed from
        jobs.update(j)
        return metrics_of(j, *a, **k)

    sim._metrics = keep
    try:
        m = sim.simulate_policy(
            tasks,
            owners,
            nodes,
            PolicyConfig(
                policy="fair",
                user_gpu_hours_per_day=None,
                eta_scenarios=args.scenarios,
                eta_head=args.eta_head,
                eta_after_budget_stretch=args.after_budget_stretch,
                eta_below_head_stretch=args.below_head_stretch,
                eta_below_head_load_max=args.below_head_load_max,
            ),
            seed=args.seed,
        )
    finally:
        sim._metrics = metrics_of
    m.pop("_waits")
    m.pop("_queue")
    records = [
        [
            j.task.submit,
            j.eta_model_at_submit if j.eta_model_at_submit is not None else j.eta_at_submit,
            j.eta_low,
            j.eta_high,
            j.first_start,
            j.finish is not None,
            j.task.gpus,
            bool(j.request.gpu_models),
            j.request.priority_class,
            j.eta_position,
        ]
        for j in jobs.values()
    ]
    return {"metrics": m, "records": records}


def evaluate(
    data: dict,
    offset: float,
    level: float,
    min_records: int = 30,
    history: tuple[int, float] | None = None,
    calibration=cal.Calibration,
) -> dict:
    """The online calibration replayed; ``history``: the record's (newest N, within S seconds),
    default the shipped ``HISTORY_N``, ``HISTORY_S``; ``calibration``: the class (a candidate's)."""
    history_n, history_s = history or (cal.HISTORY_N, cal.HISTORY_S)
    recs = [r for r in data["records"] if r[1] is not None]
    done = sorted(
        (r[4], max(0.0, r[1] - r[0]), r[4] - r[0])
        for r in recs
        if r[4] is not None and r[4] > r[0] and r[4] - r[0] <= cal.HISTORY_MAX_WAIT_S
    )
    hist: deque = deque(maxlen=history_n)
    k = 0
    old_offset, old_n = cal.OFFSET_S, cal.HISTORY_N
    cal.OFFSET_S, cal.HISTORY_N = offset, history_n  # the module's score, mapping and record use them
    rows = []
    # Per waiting job that finished: (record, low, high, its bucket's own low and high before
    # the monotone bounds, or None where uncalibrated) for decompose()
    details = []
    got, made_for = None, None  # the calibration, and the record (newest, oldest) it was made from
    try:
        for rec in sorted(recs, key=lambda r: r[0]):
            sub, eta, given_low, given_high, fs, finished = rec[:6]
            while k < len(done) and done[k][0] < sub:
                hist.append(done[k])
                k += 1
            while hist and hist[0][0] < sub - history_s:
                hist.popleft()
            if fs is not None and fs == sub:  # started in its submit pass
                rows.append((sub, fs, finished, sub, sub, sub, eta))
                continue
            if made_for != (k, len(hist)):  # the same record as the last submit's: the same calibration
                made_for = (k, len(hist))
                got = (
                    calibration([(p, a) for _, p, a in hist], level, min_records) if len(hist) >= min_records else None
                )
            out = got.calibrate(sub, eta) if got is not None else None
            # Too little record: the forward simulation's range stands (as given in the run).
            point, low, high = out if out is not None else (eta, given_low, given_high)
            rows.append((sub, fs, finished, point, low, high, eta))
            if fs is not None and finished and low is not None:
                own = None
                if out is not None:
                    predicted = max(0.0, eta - sub)
                    f = got.factors[bisect.bisect_right(cal.EDGES_S, predicted)]
                    base = predicted + offset
                    own = (sub + max(0.0, base * f[1] - offset), sub + max(0.0, base * f[2] - offset))
                details.append((rec, low, high, own))
    finally:
        cal.OFFSET_S, cal.HISTORY_N = old_offset, old_n
    started = [r for r in rows if r[1] is not None and r[2]]
    waited = [r for r in started if r[1] > r[0]]
    ranged = [r for r in started if r[4] is not None]

    def inside(r):
        return r[4] is not None and r[4] - 1 <= r[1] <= r[5] + 1

    return {
        "coverage": sum(map(inside, started)) / len(started),
        "coverage_waiting": sum(map(inside, waited)) / len(waited),
        "early": sum(1 for r in waited if r[4] is not None and r[1] < r[4] - 1) / len(waited),
        "late": sum(1 for r in waited if r[4] is not None and r[1] > r[5] + 1) / len(waited),
        "width_s": sum(r[5] - r[4] for r in ranged) / max(1, len(ranged)),
        "mae_s": sum(abs(r[3] - r[1]) for r in started) / len(started),
        "mae_model_s": sum(abs(r[6] - r[1]) for r in started) / len(started),
        "buckets": {
            str(b): sum(1 for r in waited if bisect.bisect_right(cal.EDGES_S, max(0.0, r[6] - r[0])) == b)
            for b in range(len(cal.EDGES_S) + 1)
        },
        "details": details,
        "ranged_n": len(ranged),
    }


POSITION_BANDS = ((1, 1), (2, 8), (9, 32), (33, 128), (129, 512), (513, None))


def _shape(gpus: float) -> str:
    return "shared (< 1 GPU)" if gpus < 1 else "1 GPU" if gpus == 1 else "2-4 GPUs" if gpus <= 4 else "8 GPUs"


def decompose(e: dict, mean_wait: float, ranged_n: int) -> list[str]:
    """Where the mean width comes from: per predicted-wait bucket, queue position when the ETA was
    given (the forward head is the first ``eta_head``), shape and GPU-model constraint, the waiting
    jobs' count, coverage, mean width, their share of the mean width (in mean waits: the shares add
    up to width / mean wait), and the part of it that the monotone bounds added."""
    rows = e["details"]

    def span(s: float) -> str:
        return f"{s / 60:g} min" if s < 3600 else f"{s / 3600:g} h" if s < 86400 else f"{s / 86400:g} days"

    edges = cal.EDGES_S
    names = [f"< {span(edges[0])}"] + [f"{span(lo)} - {span(hi)}" for lo, hi in zip(edges, edges[1:], strict=False)]
    names.append(f"> {span(edges[-1])}")

    def position(r):
        pos = r[0][9] if len(r[0]) > 9 else None
        if pos is None:
            return (len(POSITION_BANDS), "(not recorded)")
        for k, (lo, hi) in enumerate(POSITION_BANDS):
            if pos >= lo and (hi is None or pos <= hi):
                return (k, f"{lo}-{hi}" if hi is not None and hi > lo else f"{lo}" if hi else f"> {lo - 1}")
        raise AssertionError(pos)

    def bucket(r):
        b = bisect.bisect_right(cal.EDGES_S, max(0.0, r[0][1] - r[0][0]))
        return (b, names[b])

    shapes = ("shared (< 1 GPU)", "1 GPU", "2-4 GPUs", "8 GPUs")
    groupings = {
        "predicted wait": bucket,
        "position": position,
        "shape": lambda r: (shapes.index(_shape(r[0][6])), _shape(r[0][6])),
        "GPU models constrained": lambda r: (int(bool(r[0][7])), "yes" if r[0][7] else "no"),
    }
    out = []
    for title, key in groupings.items():
        out.append(f"\nby {title}:")
        out.append(
            "| group | waiting jobs | coverage | mean width h | mean wait h | width share (× mean wait) | of it by the bounds |"
        )
        out.append("|---|---:|---:|---:|---:|---:|---:|")
        groups: dict = {}
        for r in rows:
            groups.setdefault(key(r), []).append(r)
        for order_name in sorted(groups):
            g, name = groups[order_name], order_name[1]
            width = sum(r[2] - r[1] for r in g)
            own = sum(r[3][1] - r[3][0] for r in g if r[3] is not None) + sum(r[2] - r[1] for r in g if r[3] is None)
            covered = sum(1 for r in g if r[1] - 1 <= r[0][4] <= r[2] + 1)
            wait = sum(r[0][4] - r[0][0] for r in g)
            out.append(
                f"| {name} | {len(g):,} | {covered / len(g):.3f} | {width / len(g) / 3600:,.1f} | "
                f"{wait / len(g) / 3600:,.1f} | {width / ranged_n / mean_wait:.3f} | {(width - own) / ranged_n / mean_wait:.3f} |"
            )
    out.append(_hindsight(rows, mean_wait, ranged_n))
    return out


def _hindsight(rows: list, mean_wait: float, ranged_n: int, level: float = 0.8) -> str:
    """How narrow the longest bucket's ranges could be in hindsight: the narrowest single range
    of waits that holds ``level`` of its waiting jobs' actual waits (no predictor: what a bucket
    can do that knows only that a job is in it), against the whole width budget per such job (the
    mean wait times the started jobs over their count: the mean width each could have if every
    other job's range were empty)."""
    waits = sorted(r[0][4] - r[0][0] for r in rows if r[0][1] - r[0][0] >= cal.EDGES_S[-1])
    n = len(waits)
    if n == 0:
        return "\nhindsight: no waiting job in the longest bucket"
    k = max(1, math.ceil(level * n))
    narrowest = min(waits[i + k - 1] - waits[i] for i in range(n - k + 1))
    return (
        f"\nhindsight, the {n:,} waiting jobs predicted over {cal.EDGES_S[-1] / 86400:g} days: the narrowest single "
        f"range holding {level:.0%} of their waits is {narrowest / 86400:,.1f} days; the whole width budget per such "
        f"job is {mean_wait * ranged_n / n / 86400:,.1f} days"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trace")
    parser.add_argument("--nodes", default="4x8")
    parser.add_argument("--load", type=float, default=0.95)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-tasks", type=int, help="the trace's first N tasks only (a quick look)")
    parser.add_argument(
        "--scenarios", type=int, default=PolicyConfig().eta_scenarios, help="forward-ETA scenarios of the replay"
    )
    parser.add_argument(
        "--eta-head", type=int, default=PolicyConfig().eta_head, help="waiting jobs forward-simulated (below: coarse)"
    )
    parser.add_argument(
        "--after-budget-stretch",
        action=argparse.BooleanOptionalAction,
        default=PolicyConfig().eta_after_budget_stretch,
        help="head jobs past the forward step budget: coarse wait stretched by inflow (eta_after_budget_stretch)",
    )
    parser.add_argument(
        "--below-head-stretch",
        action=argparse.BooleanOptionalAction,
        default=PolicyConfig().eta_below_head_stretch,
        help="jobs below the forward head: coarse wait stretched by inflow (eta_below_head_stretch)",
    )
    parser.add_argument(
        "--below-head-load-max",
        type=float,
        default=PolicyConfig().eta_below_head_load_max,
        help="below the head the stretch is at most 1 / (1 - this) (eta_below_head_load_max; 0.9: x10)",
    )
    parser.add_argument("--save", help="write the replay's records here")
    parser.add_argument("--records", help="read records saved by --save instead of replaying")
    parser.add_argument("--offset", default=str(cal.OFFSET_S), help="comma-separated offsets c (s)")
    parser.add_argument("--level", default=str(PolicyConfig().eta_coverage), help="comma-separated levels")
    parser.add_argument(
        "--history",
        default=f"{cal.HISTORY_N}:{cal.HISTORY_S / 86400:g}",
        help="comma-separated N:DAYS track records (the newest N starts within DAYS)",
    )
    parser.add_argument(
        "--decompose",
        action="store_true",
        help="where the first setting's width comes from (bucket, position, shape) and how narrow the longest bucket could be in hindsight",
    )
    args = parser.parse_args(argv)
    if args.records:
        with open(args.records) as fh:
            data = json.load(fh)
        print(f"records of the replay {data.get('replay', '(settings not recorded)')}")
    else:
        data = replay(args)
        data["replay"] = {
            k: getattr(args, k)
            for k in (
                "trace",
                "nodes",
                "load",
                "seed",
                "max_tasks",
                "scenarios",
                "eta_head",
                "after_budget_stretch",
                "below_head_stretch",
                "below_head_load_max",
            )
        }
        if args.save:
            with open(args.save, "w") as fh:
                json.dump(data, fh)
    m = data["metrics"]
    print(
        f"mean wait {m['mean_wait_s']:,.0f} s (p99 {m['p99_wait_s']:,.0f}, max {m['max_wait_s']:,.0f}), "
        f"utilisation {m['utilization']:.4f}; as run: coverage {m['eta_coverage']:.3f} "
        f"(waited {m['eta_coverage_waiting']:.3f}), width {m['eta_width_mean_s']:,.0f} s, MAE {m['eta_mae_s']:,.0f} s"
    )
    print(
        "| record N / days | offset c s | level | coverage | waited | early | late | width s | width / wait | MAE s "
        "| model MAE s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    histories = [(int(n), float(days)) for n, days in (h.split(":") for h in args.history.split(","))]
    settings = [
        (h, o, v)
        for h in histories
        for o in map(float, args.offset.split(","))
        for v in map(float, args.level.split(","))
    ]
    for (n, days), offset, level in settings:
        e = evaluate(data, offset, level, history=(n, days * 86400))
        print(
            f"| {n:,} / {days:g} | {offset:,.0f} | {level:.2f} | {e['coverage']:.3f} | {e['coverage_waiting']:.3f} | "
            f"{e['early']:.3f} | {e['late']:.3f} | {e['width_s']:,.0f} | {e['width_s'] / m['mean_wait_s']:.2f} | "
            f"{e['mae_s']:,.0f} | {e['mae_model_s']:,.0f} |"
        )
        if args.decompose and ((n, days), offset, level) == settings[0]:
            print("\n".join(decompose(e, m["mean_wait_s"], e["ranged_n"])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
