"""Submit throughput and latency, and Slurm's sbatch in the same run as the baseline.

    python bench/submit.py [--database sqlite|postgres] [--server uvicorn|daphne] [--web-workers 3]
                           [--jobs 400] [--clients 16] [--repeat 3] [--slurm] [--json out.json]

The shape is ../shared/recipes/submit_bench.py's (the one Slurm was measured with here):
N jobs from C concurrent clients (threads), each a ``POST /api/v1/jobs/`` of a JSON spec
with an Idempotency-Key, against a stack with no scheduler (so nothing trains), a node
registered (so submit checks capacity as it does in production) and the throttle raised.
Slurm: the same clients each run ``sbatch --hold`` (held jobs never start) against a private
one-node Slurm configured like ../shared/recipes/slurm-single-node.sh (common.Slurm; as
root), cancelled afterwards. Portal and Slurm runs alternate, so both see the same load.
Each figure is the median of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from common import Slurm, Stack, machine, median, percentile, rounded, run_threads, tree_cpu_s


def submit_run(base: str, token: str, *, jobs: int, clients: int, tag: str, servers: tuple[int, ...] = ()) -> dict:
    """One run; CPU per job = the server processes' (``servers`` and their children) plus
    this client's own, so the figure does not depend on how busy the machine is."""
    cpu_before = tree_cpu_s(*servers) + time.process_time()
    latencies: list[float] = []
    codes: dict[str, int] = {}
    lock = threading.Lock()
    per = jobs // clients

    def client(i: int) -> None:
        for k in range(per):
            body = json.dumps({"task_name": f"bench-{tag}-{i}-{k}", "allow_duplicate": True, "team": "vision",
                               "command": f"yolo train data=demo model=yolov8n.yaml epochs={1 + (i * per + k) % 50} "
                                          "imgsz=64",
                               "resources": {"gpu": 1}, "priority": "low", "timeout": 3600}).encode()
            request = urllib.request.Request(base + "/api/v1/jobs/", data=body, method="POST", headers={
                "Authorization": "Token " + token, "Content-Type": "application/json",
                "Idempotency-Key": str(uuid.uuid4())})
            started = time.perf_counter()
            try:
                with urllib.request.urlopen(request, timeout=60) as response:
                    code = str(response.status)
            except urllib.error.HTTPError as exc:
                code = str(exc.code)
            except Exception as exc:  # noqa: BLE001 - counted, like the recipe does
                code = type(exc).__name__
            elapsed = time.perf_counter() - started
            with lock:
                latencies.append(elapsed)
                codes[code] = codes.get(code, 0) + 1

    wall = run_threads(clients, client)
    cpu = tree_cpu_s(*servers) + time.process_time() - cpu_before
    return {"accepted_per_s": codes.get("201", 0) / wall, "p50_ms": 1000 * percentile(latencies, 50),
            "p95_ms": 1000 * percentile(latencies, 95), "codes": codes, "elapsed_s": wall,
            "cpu_ms_per_job": 1000 * cpu / max(1, codes.get("201", 0))}


def slurm_run(slurm: Slurm, *, jobs: int, clients: int) -> dict:
    """The same clients each running ``sbatch --hold`` (held jobs never start; cancelled after)."""
    latencies: list[float] = []
    codes: dict[str, int] = {}
    lock = threading.Lock()
    per = jobs // clients
    daemons = [*slurm.pids(), *(int(p) for p in subprocess.run(["pgrep", "-x", "munged"], capture_output=True,
                                                                 text=True).stdout.split())]
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_before = tree_cpu_s(*daemons) + usage.ru_utime + usage.ru_stime

    def client(i: int) -> None:
        for k in range(per):
            started = time.perf_counter()
            result = slurm.sbatch("--hold", "-J", f"bench-{i}-{k}", "--gres=gpu:1", "-t", "60", "--wrap", "sleep 1")
            elapsed = time.perf_counter() - started
            with lock:
                latencies.append(elapsed)
                key = "ok" if result.returncode == 0 else f"rc{result.returncode}"
                codes[key] = codes.get(key, 0) + 1

    wall = run_threads(clients, client)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = tree_cpu_s(*daemons) + usage.ru_utime + usage.ru_stime - cpu_before  # sbatch processes + daemons
    slurm.cancel()
    return {"accepted_per_s": codes.get("ok", 0) / wall, "p50_ms": 1000 * percentile(latencies, 50),
            "p95_ms": 1000 * percentile(latencies, 95), "codes": codes, "elapsed_s": wall,
            "cpu_ms_per_job": 1000 * cpu / max(1, codes.get("ok", 0))}


def summary(runs: list[dict]) -> dict:
    return {"accepted_per_s": rounded(median([r["accepted_per_s"] for r in runs])),
            "cpu_ms_per_job": rounded(median([r["cpu_ms_per_job"] for r in runs]), 2),
            "p50_ms": rounded(median([r["p50_ms"] for r in runs])),
            "p95_ms": rounded(median([r["p95_ms"] for r in runs])),
            "runs": [{k: rounded(v) if isinstance(v, float) else v for k, v in r.items()} for r in runs]}


def measure(database: str, server: str, workers: int, *, jobs: int, clients: int, repeat: int,
            slurm: Slurm | None) -> dict:
    """``repeat`` portal runs, each followed by a Slurm run when there is one (so both see the
    same machine load); the first run of each only warms up (caches, connections)."""
    portal_runs, slurm_runs = [], []
    with Stack(f"submit-{database}-{server}", database) as stack:
        token = stack.prepare(node_gpus=8)
        base = stack.start_web(server=server, workers=workers)
        submit_run(base, token, jobs=clients * 4, clients=clients, tag="warm")
        if slurm:
            slurm_run(slurm, jobs=clients * 4, clients=clients)
        for n in range(repeat):
            portal_runs.append(submit_run(base, token, jobs=jobs, clients=clients, tag=f"r{n}",
                                          servers=(stack.processes["web"].pid, stack.redis.process.pid)))
            if slurm:
                slurm_runs.append(slurm_run(slurm, jobs=jobs, clients=clients))
    portal = summary(portal_runs)
    portal.update({"database": database, "server": server, "web_workers": workers if server == "uvicorn" else 1})
    return {"portal": portal, "slurm": summary(slurm_runs) if slurm_runs else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--server", choices=["uvicorn", "daphne"], default="uvicorn")
    parser.add_argument("--web-workers", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=400)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--slurm", action="store_true", help="also measure sbatch --hold (the baseline)")
    parser.add_argument("--json")
    args = parser.parse_args(argv)

    result = {"machine": machine(), "jobs": args.jobs, "clients": args.clients, "repeat": args.repeat}
    if args.slurm and not Slurm.available():
        print("slurm: sbatch/slurmctld not available (../shared/recipes/slurm-single-node.sh installs them)")
    if args.slurm and Slurm.available():
        with Slurm() as slurm:
            result.update(measure(args.database, args.server, args.web_workers, jobs=args.jobs,
                                  clients=args.clients, repeat=args.repeat, slurm=slurm))
    else:
        result.update(measure(args.database, args.server, args.web_workers, jobs=args.jobs,
                              clients=args.clients, repeat=args.repeat, slurm=None))
    portal = result["portal"]
    print(f"portal ({portal['database']}, {portal['server']} × {portal['web_workers']}): "
          f"{portal['accepted_per_s']} jobs/s, p50 {portal['p50_ms']} ms, p95 {portal['p95_ms']} ms, "
          f"CPU {portal['cpu_ms_per_job']} ms/job "
          f"(median of {args.repeat} × {args.jobs} jobs from {args.clients} clients)")
    if result.get("slurm"):
        slurm = result["slurm"]
        print(f"slurm sbatch --hold: {slurm['accepted_per_s']} jobs/s, p50 {slurm['p50_ms']} ms, "
              f"p95 {slurm['p95_ms']} ms, CPU {slurm['cpu_ms_per_job']} ms/job; portal/slurm = {portal['accepted_per_s'] / slurm['accepted_per_s']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
