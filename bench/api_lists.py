"""`GET jobs/` and `GET queue/` latency with 100,000 jobs in the database, against 1,000.

    python bench/api_lists.py [--database sqlite|postgres] [--jobs 100000] [--requests 100] [--repeat 3]

A throwaway stack (common.Stack) served as ``make run`` serves it; the jobs are made with
one INSERT … SELECT (tests/jobs/bulk.py: 20 teams, alice's team holds one in 20, one in 50
queued). The baseline, in the same run and on the same server, is the same requests when
the database holds 1,000 jobs. Each request is one of alice's, sequential (latency, not
throughput): her team's newest jobs (the first page, 100), her own, one state, the queue's
first page; p50/p95 per endpoint, the median over ``--repeat`` rounds.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from common import Stack, http_get, machine, median, percentile, rounded

ENDPOINTS = {
    "jobs/": "/api/v1/jobs/",
    "jobs/?mine=1": "/api/v1/jobs/?mine=1",
    "jobs/?state=failed": "/api/v1/jobs/?state=failed",
    "queue/": "/api/v1/queue/",
}


def fill(total: int) -> None:
    """Top the database up to ``total`` jobs (this process's Django points at the stack)."""
    from django.contrib.auth import get_user_model
    from django.db import transaction

    from apps.accounts.models import Team
    from apps.accounts.services import membership_set, team_ensure
    from apps.jobs.models import Job
    from tests.jobs.bulk import insert_jobs

    have = Job.objects.count()
    if have >= total:
        return
    with transaction.atomic():
        owners = []
        alice = get_user_model().objects.get(username="alice")
        owners.append((Team.objects.get(slug="vision"), alice))
        for t in range(19):
            team = team_ensure(slug=f"bench-team-{t}")
            user, _ = get_user_model().objects.get_or_create(username=f"bench-{t}", defaults={"password": "!"})
            membership_set(user=user, team=team, role="member")
            owners.append((team, user))
        insert_jobs(total - have, owners=owners)
    from django.db import connection

    if connection.vendor == "postgresql":
        # What autovacuum does within a minute of such an insert: without it the planner
        # plans the 100k-job lists with the statistics of an empty table.
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")


def measure(base: str, token: str, requests: int) -> dict:
    out = {}
    for name, path in ENDPOINTS.items():
        http_get(base + path, token)  # warm
        latencies = []
        for _ in range(requests):
            started = time.perf_counter()
            status, body = http_get(base + path, token)
            latencies.append(1000 * (time.perf_counter() - started))
            if status != 200:
                raise RuntimeError(f"GET {path}: {status} {body[:300]!r}")
        out[name] = {"p50_ms": percentile(latencies, 50), "p95_ms": percentile(latencies, 95),
                     "rows": len(json.loads(body)["results"])}
    return out


def summary(rounds: list[dict]) -> dict:
    return {name: {"p50_ms": rounded(median([r[name]["p50_ms"] for r in rounds])),
                   "p95_ms": rounded(median([r[name]["p95_ms"] for r in rounds])),
                   "rows": rounds[0][name]["rows"]} for name in ENDPOINTS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--baseline-jobs", type=int, default=1_000)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--web-workers", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args(argv)

    with Stack(f"lists-{args.database}", args.database) as stack:
        token = stack.prepare(node_gpus=8)
        stack.django()
        fill(args.baseline_jobs)
        base = stack.start_web(workers=args.web_workers)
        small = summary([measure(base, token, args.requests) for _ in range(args.repeat)])
        started = time.monotonic()
        fill(args.jobs)
        filled_s = time.monotonic() - started
        big = summary([measure(base, token, args.requests) for _ in range(args.repeat)])
    result = {"machine": machine(), "database": args.database, "jobs": args.jobs, "requests": args.requests,
              "repeat": args.repeat, "fill_s": round(filled_s, 1), "at_jobs": big,
              "baseline_at_jobs": args.baseline_jobs, "baseline": small}
    print(f"{'endpoint':22} {'p95 @' + str(args.baseline_jobs):>12} {'p95 @' + str(args.jobs):>14}  rows")
    for name in ENDPOINTS:
        print(f"{name:22} {small[name]['p95_ms']:>10} ms {big[name]['p95_ms']:>12} ms  {big[name]['rows']}")
    worst = max(big[name]["p95_ms"] for name in ENDPOINTS)
    print(f"target p95 ≤ 50 ms at {args.jobs} jobs: {'met' if worst <= 50 else 'NOT met'} (worst {worst} ms)")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
