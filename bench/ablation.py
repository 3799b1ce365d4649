"""Ablation of the fair policy on a trace: switch off one factor or mechanism at a time.

    python bench/ablation.py --trace ../shared/traces/openb_pod_list_default.csv --nodes 4x8 \
        --load 0.95 --seed 1 --json docs/scheduling_ablation.json

Prints a markdown table (the one in docs/scheduling.md). Every variant replays the same
trace with the same owners and walltime estimates; quotas are off as in ``simulate``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from apps.scheduling.policy import PolicyConfig  # noqa: E402
from apps.scheduling.simulator import run_simulation  # noqa: E402

BASE = PolicyConfig(policy="fair", user_gpu_hours_per_day=None)
# The policy of before this issue: none of the second step's mechanisms, urgent preemption
# kills at once, ETAs from the pooled sweep alone (no range).
BEFORE = replace(BASE, preempt_grace_s=0.0, eta_scenarios=0, eta_coverage=0.0)
ALL_ON = replace(BASE, size_preemption=True, bounded_wait=True, fragmentation_aware=True)
VARIANTS = {
    "fair (shipped defaults)": BASE,
    "before this issue": BEFORE,
    "+ size-aware preemption": replace(BASE, size_preemption=True),
    "+ bounded waiting": replace(BASE, bounded_wait=True),
    "+ fragmentation-aware placement": replace(BASE, fragmentation_aware=True),
    "all three on": ALL_ON,
    "all on, preemption ratio 4": replace(ALL_ON, preempt_work_ratio=4.0, max_preemptions_per_job=2),
    "no graceful preemption (kill)": replace(BASE, preempt_grace_s=0.0),
    # Same starts as the shipped defaults (ETAs change none): the forward simulation's own
    # P10-P90, not calibrated on the track record.
    "ranges uncalibrated": replace(BASE, eta_coverage=0.0),
    "no fair-share": replace(BASE, weight_fairshare=0),
    "no age": replace(BASE, weight_age=0),
    "no size": replace(BASE, weight_size=0),
    "size 'small lift' (1000)": replace(BASE, weight_size=1000),
    "no class": replace(BASE, weight_class=0),
    "EASY (1 reservation)": replace(BASE, reservations=1),
    "no reservations": replace(BASE, reservations=0),
    "no backfill": replace(BASE, backfill=False),
    "plain best fit (no drain-aware)": replace(BASE, drain_aware=False),
    "fifo": PolicyConfig(policy="fifo", user_gpu_hours_per_day=None),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trace", required=True)
    parser.add_argument("--nodes", default="4x8")
    parser.add_argument("--load", type=float, default=0.95)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", default="", help="comma-separated variant labels")
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args(argv)
    chosen = [v for v in VARIANTS if not args.only or v in args.only.split(",")]
    result = run_simulation(
        args.trace, args.nodes, [(label, VARIANTS[label]) for label in chosen], seed=args.seed, load=args.load
    )
    lb = result["lower_bound"]["mean_jct_s"]
    print(
        "| variant | mean wait s | p99 wait s | max wait s | mean JCT / LB | util | Jain | rho P95 | "
        "users rho<=2 | ETA MAE s | coverage | width s | preemptions |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, m in result["policies"].items():
        print(
            f"| {label} | {m['mean_wait_s']:,.0f} | {m['p99_wait_s']:,.0f} | {m['max_wait_s']:,.0f} | "
            f"{m['mean_jct_s'] / lb:.2f} | {m['utilization']:.3f} | {m['jain_fairness']:.3f} | "
            f"{m['rho_p95']:.2f} | {m['users_rho_le_2']:.2f} | {m['eta_mae_s']:,.0f} | "
            f"{m['eta_coverage']:.2f} | {m['eta_width_mean_s']:,.0f} | {m['preemptions']} |"
        )
    if args.json_path:
        with open(args.json_path, "w") as fh:
            json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
