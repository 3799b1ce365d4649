"""Submit throughput and latency, and Slurm's sbatch in the same run as the baseline.

    python bench/submit.py [--database sqlite|postgres] [--server uvicorn|daphne] [--web-workers 3]
                           [--jobs 400] [--clients 16] [--repeat 3] [--slurm] [--json out.json]
                           [--keepalive] [--users 1]

The shape is ../shared/recipes/submit_bench.py's (the one Slurm was measured with here):
N jobs from C concurrent clients (threads), each a ``POST /api/v1/jobs/`` of a JSON spec
with an Idempotency-Key, against a stack with no scheduler (so nothing trains), a node
registered (so submit checks capacity as it does in production) and the throttle raised.
Slurm: the same clients each run ``sbatch --hold`` (held jobs never start) against a private
one-node Slurm configured like ../shared/recipes/slurm-single-node.sh (common.Slurm; as
root), cancelled afterwards. Portal and Slurm runs alternate, so both see the same load.
Each figure is the median of ``--repeat`` runs.

By default each submit opens a new connection (``urllib``), as each ``sbatch`` is a new
process: the figure comparable with every earlier one. ``--keepalive`` gives each client one
HTTP/1.1 connection it keeps (reconnecting when the server closes it), as a real client
does (the CLI's ``requests`` session); it is reported as a separate row, never in place
of the default. ``--users N`` spreads the clients over N users of the team (client ``i``
submits as user ``i % N``; the first is alice): one user's submits serialise on that user's
row lock on PostgreSQL (the active-job cap is counted under it), and a real service has
many users. The default (1) is the figure comparable with earlier ones.
"""

from __future__ import annotations

import argparse
import http.client
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


def post_new_connection(base: str, body: bytes, headers: dict, state: dict) -> str:
    """One POST on a connection of its own (urllib): the status as text, or the error's name."""
    request = urllib.request.Request(base + "/api/v1/jobs/", data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return str(response.status)
    except urllib.error.HTTPError as exc:
        return str(exc.code)
    except Exception as exc:  # noqa: BLE001 - counted, like the recipe does
        return type(exc).__name__


def post_keepalive(base: str, body: bytes, headers: dict, state: dict) -> str:
    """One POST on this client's kept connection (``state["conn"]``), reconnecting once when
    the server has closed it (keep-alive timeout) before answering."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    for attempt in (1, 2):
        conn = state.get("conn")
        if conn is None:
            conn = state["conn"] = http.client.HTTPConnection(host, int(port), timeout=60)
        try:
            conn.request("POST", "/api/v1/jobs/", body=body, headers=headers)
            response = conn.getresponse()
            response.read()
            if response.will_close:
                conn.close()
                state["conn"] = None
            return str(response.status)
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as exc:
            conn.close()
            state["conn"] = None
            if attempt == 2:
                return type(exc).__name__
        except Exception as exc:  # noqa: BLE001 - counted, like the recipe does
            conn.close()
            state["conn"] = None
            return type(exc).__name__
    return "unreachable"


def submit_run(base: str, tokens: list[str], *, jobs: int, clients: int, tag: str, servers: tuple[int, ...] = (),
               keepalive: bool = False) -> dict:
    """One run; CPU per job = the server processes' (``servers`` and their children) plus
    this client's own, so the figure does not depend on how busy the machine is. Client ``i``
    submits as ``tokens[i % len(tokens)]``."""
    cpu_before = tree_cpu_s(*servers) + time.process_time()
    latencies: list[float] = []
    codes: dict[str, int] = {}
    lock = threading.Lock()
    per = jobs // clients
    post = post_keepalive if keepalive else post_new_connection

    def client(i: int) -> None:
        state: dict = {}
        token = tokens[i % len(tokens)]
        for k in range(per):
            body = json.dumps({"task_name": f"bench-{tag}-{i}-{k}", "allow_duplicate": True, "team": "vision",
                               "command": f"yolo train data=demo model=yolov8n.yaml epochs={1 + (i * per + k) % 50} "
                                          "imgsz=64",
                               "resources": {"gpu": 1}, "priority": "low", "timeout": 3600}).encode()
            headers = {"Authorization": "Token " + token, "Content-Type": "application/json",
                       "Idempotency-Key": str(uuid.uuid4())}
            started = time.perf_counter()
            code = post(base, body, headers, state)
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
            slurm: Slurm | None, keepalive: bool = False, users: int = 1) -> dict:
    """``repeat`` portal runs, each followed by a Slurm run when there is one (so both see the
    same machine load); the first run of each only warms up (caches, connections)."""
    portal_runs, slurm_runs = [], []
    with Stack(f"submit-{database}-{server}", database) as stack:
        tokens = [stack.prepare(node_gpus=8), *stack.users(users - 1, team="vision")]
        base = stack.start_web(server=server, workers=workers)
        submit_run(base, tokens, jobs=clients * 4, clients=clients, tag="warm", keepalive=keepalive)
        if slurm:
            slurm_run(slurm, jobs=clients * 4, clients=clients)
        for n in range(repeat):
            portal_runs.append(submit_run(base, tokens, jobs=jobs, clients=clients, tag=f"r{n}",
                                          servers=(stack.processes["web"].pid, stack.redis.process.pid),
                                          keepalive=keepalive))
            if slurm:
                slurm_runs.append(slurm_run(slurm, jobs=jobs, clients=clients))
    portal = summary(portal_runs)
    portal.update({"database": database, "server": server, "web_workers": workers if server == "uvicorn" else 1,
                   "keepalive": keepalive, "users": users})
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
    parser.add_argument("--keepalive", action="store_true",
                        help="each client keeps one HTTP connection (default: a new connection per submit)")
    parser.add_argument("--users", type=int, default=1, help="spread the clients over this many users (default 1)")
    parser.add_argument("--json")
    args = parser.parse_args(argv)

    if args.users < 1:
        parser.error("--users must be 1 or more")
    result = {"machine": machine(), "jobs": args.jobs, "clients": args.clients, "repeat": args.repeat}
    options = {"keepalive": args.keepalive, "users": args.users}
    if args.slurm and not Slurm.available():
        print("slurm: sbatch/slurmctld not available (../shared/recipes/slurm-single-node.sh installs them)")
    if args.slurm and Slurm.available():
        with Slurm() as slurm:
            result.update(measure(args.database, args.server, args.web_workers, jobs=args.jobs,
                                  clients=args.clients, repeat=args.repeat, slurm=slurm, **options))
    else:
        result.update(measure(args.database, args.server, args.web_workers, jobs=args.jobs,
                              clients=args.clients, repeat=args.repeat, slurm=None, **options))
    portal = result["portal"]
    how = ("keep-alive" if args.keepalive else "a connection per submit") + (
        f", {args.users} users" if args.users > 1 else ", 1 user")
    print(f"portal ({portal['database']}, {portal['server']} × {portal['web_workers']}; {how}): "
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
