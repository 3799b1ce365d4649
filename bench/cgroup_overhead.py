"""What a per-attempt cgroup costs: create it with its limits, start the child inside it, read
its measurements, remove it — against starting the same child without one, in the same run.

    sudo python bench/cgroup_overhead.py [--runs 50] [--child true|python] [--json out.json]

The child is ``/bin/true`` by default (so the difference is the cgroup work itself) or
``python -c pass`` (an interpreter start, for scale). Runs alternate, so machine load hits
both the same; prints medians, the difference per attempt and the ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from worker.executors import cgroups  # noqa: E402
from worker.executors.cgroups import Limits  # noqa: E402


def plain(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.Popen(command).wait()
    return time.perf_counter() - started


def in_cgroup(host: cgroups.Host, command: list[str], number: int) -> float:
    started = time.perf_counter()
    group = host.create(cgroups.attempt_name(f"bench-{number}"),
                        Limits(memory_bytes=4 * 2**30, cpus=1.0, pids=4096))
    subprocess.Popen(command, preexec_fn=lambda: cgroups.join(group.procs_files)).wait()
    group.usage()
    group.remove()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--child", choices=["true", "python"], default="true")
    parser.add_argument("--json")
    args = parser.parse_args()
    host = cgroups.probe()
    if not host.enforced:
        raise SystemExit(f"no writable cgroups here: {host.describe()}")
    command = ["/bin/true"] if args.child == "true" else [sys.executable, "-c", "pass"]
    base, with_cgroup = [], []
    for number in range(args.runs):
        base.append(plain(command))
        with_cgroup.append(in_cgroup(host, command, number))
    b, c = statistics.median(base), statistics.median(with_cgroup)
    result = {"host": host.describe(), "child": args.child, "runs": args.runs,
              "median_without_cgroup_ms": round(b * 1000, 2), "median_with_cgroup_ms": round(c * 1000, 2),
              "overhead_per_attempt_ms": round((c - b) * 1000, 2), "ratio": round(c / b, 2)}
    print(f"{host.describe()}; child {' '.join(command)}; {args.runs} runs each, alternating")
    print(f"  without a cgroup: median {result['median_without_cgroup_ms']:.2f} ms")
    print(f"  with a cgroup (create + limits + join + usage + remove): median {result['median_with_cgroup_ms']:.2f} ms")
    print(f"  overhead per attempt: {result['overhead_per_attempt_ms']:.2f} ms ({result['ratio']}x)")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
