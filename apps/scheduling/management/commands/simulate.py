"""``manage.py simulate``: replay an openb trace through the scheduling policy (no database)."""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandParser

from apps.scheduling.simulator import JobModel, run_simulation


class Command(BaseCommand):
    help = "Replay a GPU trace (openb format) through the fifo and/or fair policy with simulated time."
    requires_system_checks: list[str] = []
    requires_migrations_checks = False

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--trace", required=True, help="openb pod list CSV")
        parser.add_argument("--nodes", required=True, help="openb node list CSV, or NxG (N nodes of G GPUs)")
        parser.add_argument(
            "--policy",
            action="append",
            choices=("fifo", "fair"),
            help="policy to run; repeat for several (default: fifo and fair)",
        )
        parser.add_argument("--seed", type=int, default=0, help="seed for users/teams and walltime noise")
        parser.add_argument("--load", type=float, default=None, help="rescale arrivals to this offered load")
        parser.add_argument("--users", type=int, default=40)
        parser.add_argument("--teams", type=int, default=6)
        parser.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of tasks per user")
        parser.add_argument(
            "--walltime-sigma",
            type=float,
            default=0.5,
            help="lognormal sigma of walltime estimates around true durations",
        )
        parser.add_argument("--checkpoint-s", type=float, default=600.0, help="longest epoch (checkpoint interval)")
        parser.add_argument("--restart-s", type=float, default=120.0, help="a resumed attempt's overhead")
        parser.add_argument("--kill", action="store_true", help="victims are killed at once (no graceful stop)")
        parser.add_argument("--preemptible", type=float, default=1.0, help="fraction of jobs whose spec allows it")
        parser.add_argument("--unestimated", type=float, default=0.0, help="fraction of jobs without an estimate")
        parser.add_argument("--json", dest="json_path", help="write the metrics here")
        parser.add_argument("--plot", dest="plot_path", help="write a PNG (wait CDF, queue length)")

    def handle(self, *args, **opts) -> None:
        result = run_simulation(
            opts["trace"],
            opts["nodes"],
            tuple(opts["policy"] or ("fifo", "fair")),
            seed=opts["seed"],
            load=opts["load"],
            users=opts["users"],
            teams=opts["teams"],
            zipf_s=opts["zipf"],
            walltime_sigma=opts["walltime_sigma"],
            model=JobModel(
                checkpoint_s=opts["checkpoint_s"],
                restart_s=opts["restart_s"],
                graceful=not opts["kill"],
                preemptible=opts["preemptible"],
                unestimated=opts["unestimated"],
            ),
            plot_path=opts["plot_path"],
        )
        if opts["json_path"]:
            with open(opts["json_path"], "w") as fh:
                json.dump(result, fh, indent=2)
        lb = result["lower_bound"]["mean_jct_s"]
        self.stdout.write(
            f"{result['tasks']} tasks on {result['nodes']} ({result['gpus']:g} GPUs), "
            f"offered load {result['offered_load']:.2f}, seed {result['seed']}"
        )
        self.stdout.write(
            f"{'policy':<8}{'jobs':>6}{'mean wait':>12}{'p99 wait':>12}{'mean JCT':>12}"
            f"{'JCT/LB':>8}{'util':>7}{'Jain':>7}{'rho95':>7}{'ETA MAE':>11}{'cover':>7}{'width':>10}{'preempt':>9}"
        )
        for name, m in result["policies"].items():
            self.stdout.write(
                f"{name:<8}{m['jobs']:>6}{m['mean_wait_s']:>12.0f}{m['p99_wait_s']:>12.0f}{m['mean_jct_s']:>12.0f}"
                f"{m['mean_jct_s'] / lb if lb else 0:>8.2f}{m['utilization']:>7.3f}{m['jain_fairness']:>7.3f}"
                f"{m['rho_p95']:>7.2f}{m['eta_mae_s']:>11.0f}{m['eta_coverage']:>7.2f}{m['eta_width_mean_s']:>10.0f}"
                f"{m['preemptions']:>9}"
            )
        self.stdout.write(f"lower bound on mean JCT: {lb:.0f} s")
