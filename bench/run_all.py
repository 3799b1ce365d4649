"""`make bench`: every benchmark, each against its baseline from the same run → bench/results.json.

    python bench/run_all.py [--only submit,lists,...] [--quick] [--out bench/results.json]

Runs each benchmark script in its own process (``--json`` into a temporary file), keeps
going when one fails (its entry holds the error; the exit status is then 1), writes
``bench/results.json`` and puts the table into docs/performance.md between its markers.
Every figure is a median of several runs; every baseline was measured in the same run.
Slurm baselines need root and slurm-wlm (../shared/recipes/slurm-single-node.sh installs
it; a private instance is started, common.Slurm); PostgreSQL figures need
scripts/postgres.sh (root). Without them those entries say why they are missing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, Slurm, machine, postgres_url

BENCH = ROOT / "bench"
DOC = ROOT / "docs" / "performance.md"
BEGIN, END = "<!-- bench:table:begin -->", "<!-- bench:table:end -->"


def steps(quick: bool, slurm: bool, postgres: bool) -> dict[str, list[str]]:
    r = "1" if quick else "3"
    s = ["--slurm"] if slurm else []
    out = {
        "submit_sqlite": ["submit.py", "--database", "sqlite", "--repeat", r, *s],
        "submit_postgres": ["submit.py", "--database", "postgres", "--repeat", r, *s],
        "lists_sqlite": ["api_lists.py", "--database", "sqlite", "--repeat", r, "--requests", "30" if quick else "100"],
        "lists_postgres": ["api_lists.py", "--database", "postgres", "--repeat", r,
                           "--requests", "30" if quick else "100"],
        "scheduler_pass_1000": ["scheduler_pass.py", "--queued", "1000", "--growth", "", "--repeat", "3" if quick else "9"],
        "scheduler_pass_10000": ["scheduler_pass.py", "--queued", "10000", "--growth", "", "--repeat", "3" if quick else "5"],
        "scheduler_pass_100000": ["scheduler_pass.py", "--queued", "100000", "--growth", "", "--repeat", "1" if quick else "3"],
        "live_pass_sqlite": ["live_pass.py", "--database", "sqlite", "--queued", "300" if quick else "1000,10000",
                             "--repeat", "1" if quick else "3"],
        "live_pass_postgres": ["live_pass.py", "--database", "postgres", "--queued", "300" if quick else "1000,10000",
                               "--repeat", "1" if quick else "3"],
        "job_latency": ["job_latency.py", "--jobs", "2" if quick else "5", "--chain", "3" if quick else "6", *s],
        "websocket": ["ws_latency.py", "--clients", "100", "--epochs", "10" if quick else "30"],
        "training": ["training_overhead.py", "--repeat", "1" if quick else "2"],
    }
    if not postgres:
        out = {k: v for k, v in out.items() if not k.endswith("_postgres")}
    return out


def run_step(name: str, argv: list[str], timeout: float) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
        out = Path(handle.name)
    started = time.monotonic()
    try:
        result = subprocess.run([sys.executable, str(BENCH / argv[0]), *argv[1:], "--json", str(out)], cwd=ROOT,
                                capture_output=True, text=True, timeout=timeout)
        elapsed = time.monotonic() - started
        print(f"--- {name} ({elapsed:.0f} s)\n{result.stdout.strip()}", flush=True)
        if result.returncode != 0 or not out.stat().st_size:
            return {"error": f"exit {result.returncode}: {(result.stderr or result.stdout)[-3000:]}",
                    "elapsed_s": round(elapsed)}
        data = json.loads(out.read_text())
        data.pop("machine", None)
        data["elapsed_s"] = round(elapsed)
        return data
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    finally:
        out.unlink(missing_ok=True)


def fmt(value, unit: str = "") -> str:
    return "—" if value is None else f"{value:g}{unit}"


def table(results: dict) -> str:
    """The Markdown table for docs/performance.md."""
    r = results["results"]
    rows = ["| what | yoloportal | baseline (same run) | target |", "| --- | --- | --- | --- |"]

    def get(*path):
        node = r
        for key in path:
            if not isinstance(node, dict) or key not in node:
                return None
            node = node[key]
        return node

    for db in ("sqlite", "postgres"):
        step = r.get(f"submit_{db}")
        if not step:
            continue
        if "error" in step:
            rows.append(f"| submit, 16 clients, {db} | failed: see results.json | | |")
            continue
        p, s = step["portal"], step.get("slurm")
        baseline = (f"sbatch: {fmt(s['accepted_per_s'])} jobs/s, p95 {fmt(s['p95_ms'])} ms; "
                    f"portal/Slurm = {p['accepted_per_s'] / s['accepted_per_s']:.2f}" if s else "no Slurm")
        cpu = p.get("cpu_ms_per_job")
        cpu_s = f"; CPU {fmt(cpu)} ms/job" if cpu is not None else ""
        scpu = f"; CPU {fmt(s.get('cpu_ms_per_job'))} ms/job" if s and s.get("cpu_ms_per_job") is not None else ""
        rows.append(f"| submit, 16 clients, {step['jobs']} jobs, {db} | {fmt(p['accepted_per_s'])} jobs/s, "
                    f"p50 {fmt(p['p50_ms'])} ms, p95 {fmt(p['p95_ms'])} ms{cpu_s} | {baseline}{scpu} "
                    f"| ≥ Slurm and ≥ 200 jobs/s, p95 ≤ 100 ms |")
    for db in ("sqlite", "postgres"):
        step = r.get(f"lists_{db}")
        if not step:
            continue
        if "error" in step:
            rows.append(f"| jobs/ and queue/ at 100k jobs, {db} | failed: see results.json | | |")
            continue
        for endpoint, figures in step["at_jobs"].items():
            base = step["baseline"][endpoint]
            rows.append(f"| GET {endpoint} p95 (p50) at {step['jobs']:,} jobs, {db} | {fmt(figures['p95_ms'])} ms "
                        f"({fmt(figures['p50_ms'])} ms) | at {step['baseline_at_jobs']:,} jobs: "
                        f"{fmt(base['p95_ms'])} ms ({fmt(base['p50_ms'])} ms) | p95 ≤ 50 ms |")
    for size in ("1000", "10000", "100000"):
        step = r.get(f"scheduler_pass_{size}")
        if step and "error" not in step:
            rows.append(f"| scheduler pass, {int(size):,} queued, {step['gpus']} GPUs | median {fmt(step['median_ms'])} ms, "
                        f"p95 {fmt(step['p95_ms'])} ms | FIFO {fmt(step['fifo_median_ms'])} ms | — |")
        elif step:
            rows.append(f"| scheduler pass, {int(size):,} queued | failed: see results.json | | |")
    for db in ("sqlite", "postgres"):
        step = r.get(f"live_pass_{db}")
        if step and "error" in step:
            rows.append(f"| live scheduler pass, {db} | failed: see results.json | | |")
            continue
        for size in (step or {}).get("sizes", []):
            steady, shifted, pure = size["scenarios"]["steady"], size["scenarios"]["submit"], size["pure_policy"]
            rows.append(f"| live scheduler pass, {size['queued']:,} queued, {db} | steady {fmt(steady['wall_ms'])} ms "
                        f"({fmt(steady['job_updates'])} UPDATEs); after an urgent submit {fmt(shifted['wall_ms'])} ms "
                        f"({fmt(shifted['job_updates'])} UPDATEs) | pure policy {fmt(pure['wall_ms'])} ms | — |")
    step = r.get("job_latency")
    if step and "error" not in step:
        z, f, fr, s = step["idle_zygote"], step["idle_fresh_interpreter"], step["freed"], step.get("slurm")
        rows.append(f"| idle submit → training process started (median) | {fmt(z['to_running_s'])} s "
                    f"(→ Ultralytics training {fmt(z['to_training_s'])} s) | fresh interpreter → training "
                    f"{fmt(f['to_training_s'])} s; Slurm sbatch → script {fmt(get('job_latency', 'slurm', 'idle_to_start_median_s'), ' s')} "
                    f"| ≤ 0.5 s |")
        rows.append(f"| GPU freed → next training process started (p95) | {fmt(fr['to_running_p95_s'])} s "
                    f"(→ Ultralytics training {fmt(fr['to_training_p95_s'])} s) | Slurm "
                    f"{fmt(s['freed_to_start_p95_s'], ' s') if s else 'not run'} | ≤ 0.5 s |")
    elif step:
        rows.append("| submit → training started | failed: see results.json | | |")
    step = r.get("websocket")
    if step and "error" not in step:
        b = step["baseline_one_client"]
        rows.append(f"| epoch metric → websocket, {step['clients']} watchers | median {fmt(step['median_ms'])} ms, "
                    f"p95 {fmt(step['p95_ms'])} ms ({step['received']}/{step['expected']} received) "
                    f"| 1 watcher: median {fmt(b['median_ms'])} ms, p95 {fmt(b['p95_ms'])} ms | — |")
    step = r.get("training")
    if step and "error" not in step:
        rows.append(f"| training through the portal ({step['epochs']} epochs) vs Ultralytics directly | per epoch "
                    f"{fmt(step['portal_per_epoch_s'])} s, fixed {fmt(step['portal_fixed_s'])} s (submit → done) "
                    f"| per epoch {fmt(step['direct_per_epoch_s'])} s, fixed {fmt(step['direct_fixed_s'])} s (start → exit); "
                    f"ratio per epoch {fmt(step['per_epoch_ratio'])}, overhead {fmt(step['fixed_overhead_s'], ' s')} | — |")
    m = results["machine"]
    return "\n".join(rows) + (
        f"\n\nMeasured {results['started_at']} on {m['cpu']} ({m['cores']} cores, {m['memory_gib']} GiB, "
        f"kernel {m['kernel']}, Python {m['python']}), commit {results['commit']}; load average at the start "
        f"{m['load_average']}, at the end {results['load_average_end']}; the whole run took "
        f"{results['elapsed_s'] // 60} min.")


def write_doc(text: str) -> None:
    if not DOC.exists():
        return
    doc = DOC.read_text()
    if BEGIN in doc and END in doc:
        head, rest = doc.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        DOC.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated step names (default: all)")
    parser.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run; figures are noisier)")
    parser.add_argument("--out", default=str(BENCH / "results.json"))
    parser.add_argument("--step-timeout", type=float, default=3600)
    parser.add_argument("--no-doc", action="store_true", help="leave docs/performance.md alone")
    args = parser.parse_args(argv)

    slurm = Slurm.available()
    postgres = postgres_url() is not None
    plan = steps(args.quick, slurm, postgres)
    if args.only:
        wanted = set(args.only.split(","))
        plan = {k: v for k, v in plan.items() if k in wanted or k.rsplit("_", 1)[0] in wanted}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    results = {"started_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit,
               "machine": machine(), "quick": args.quick,
               "baselines": {"slurm": slurm, "postgres": postgres}, "results": {}}
    started = time.monotonic()
    out = Path(args.out)
    previous = json.loads(out.read_text()) if args.only and out.exists() else None
    if previous:  # --only refreshes some entries and keeps the rest
        results["results"] = previous.get("results", {})
    for name, step_argv in plan.items():
        results["results"][name] = run_step(name, step_argv, args.step_timeout)
        out.write_text(json.dumps(results, indent=2) + "\n")
    results["elapsed_s"] = round(time.monotonic() - started)
    results["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    out.write_text(json.dumps(results, indent=2) + "\n")
    text = table(results)
    print("\n" + text)
    if not args.no_doc:
        write_doc(text)
    failed = [k for k, v in results["results"].items() if "error" in v]
    if failed:
        print(f"failed: {', '.join(failed)} (see {out})")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
