"""Benchmark: render the dashboard (and the jobs list) with 1,000 jobs in the database.

A throwaway SQLite database in a temporary folder: 2 teams, 4 nodes × 8 simulated GPUs,
1,000 jobs (a GPU's worth running, ~300 queued, the rest finished). Each page is
fetched through Django's test client (full middleware, session auth, template render,
no network) as a team manager. The baseline, measured in the same run, is the same
cluster with no jobs at all.

    python bench/dashboard_render.py [--jobs 1000] [--repeat 40]

Target (issue 4): the dashboard renders in ≤ 200 ms with 1,000 jobs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PAGES = ["/", "/dashboard/live/", "/jobs/?scope=team"]


def setup_django(data_dir: Path) -> None:
    os.environ.update({"DATA_DIR": str(data_dir), "LOG_LEVEL": "WARNING", "DJANGO_SETTINGS_MODULE": "yoloportal.settings",
                       "REDIS_URL": "redis://127.0.0.1:1/0"})  # nothing here talks to Redis
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def make_cluster():
    from apps.accounts.services import membership_set, team_ensure, user_ensure
    from worker.inventory import simulated_gpus
    from worker.node import register_this_host

    teams = [team_ensure(slug="vision"), team_ensure(slug="robotics")]
    users = []
    for n in range(10):
        user = user_ensure(username=f"user{n}", password="pw")
        membership_set(user=user, team=teams[n % 2], role="manager" if n == 0 else "member")
        users.append(user)
    nodes = [register_this_host(name=f"gpu-{n}", gpus=simulated_gpus(8)) for n in range(4)]
    return teams, users, nodes


def make_jobs(count: int, teams, users, nodes) -> None:
    import hashlib
    import random
    from datetime import timedelta

    from django.utils import timezone

    from apps.jobs.models import Job, JobState

    rng = random.Random(1)
    now = timezone.now()
    slots = [(node, index) for node in nodes for index in range(8)]
    jobs = []
    for n in range(count):
        user = users[n % len(users)]
        team = teams[(n % len(users)) % 2]
        if n < len(slots):
            state, (node, gpu) = JobState.RUNNING, slots[n]
        elif n < len(slots) + 300:
            state, node, gpu = JobState.QUEUED, None, None
        else:
            state, node, gpu = rng.choice([JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED]), None, None
        jobs.append(Job(
            task_name=f"job-{n}", team=team, user=user, state=state,
            priority_class=rng.choice(["low", "medium", "high", "urgent"]),
            spec={"train_args": {"data": "demo", "model": "yolov8n.yaml", "epochs": 100}},
            spec_hash=hashlib.sha256(str(n).encode()).hexdigest(), gpus=1, timeout_s=3600,
            node=node, gpu_indices=[gpu] if gpu is not None else [],
            queue_position=n - len(slots) + 1 if state == JobState.QUEUED else None,
            estimated_start_at=now + timedelta(minutes=n) if state == JobState.QUEUED else None,
            reason="waiting for 1 GPU" if state == JobState.QUEUED else "",
            started_at=now - timedelta(minutes=5) if state == JobState.RUNNING else None,
        ))
    Job.objects.bulk_create(jobs, batch_size=500)


def timed(client, path: str, repeat: int) -> list[float]:
    samples = []
    client.get(path)  # warm: template loading, first queries
    for _ in range(repeat):
        started = time.perf_counter()
        response = client.get(path)
        samples.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, (path, response.status_code)
    return samples


def line(name: str, samples: list[float]) -> str:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return f"{name:<38} median {statistics.median(ordered):7.1f} ms   p95 {p95:7.1f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=40)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="dash-bench-") as folder:
        setup_django(Path(folder))
        from django.db import connection
        from django.test import Client
        from django.test.utils import CaptureQueriesContext

        teams, users, nodes = make_cluster()
        client = Client()
        client.force_login(users[0])
        results = {}
        for path in PAGES:
            results[("baseline", path)] = timed(client, path, args.repeat)
        make_jobs(args.jobs, teams, users, nodes)
        for path in PAGES:
            results[("loaded", path)] = timed(client, path, args.repeat)
        print(f"{args.jobs} jobs, {len(nodes)} nodes × 8 GPUs, {args.repeat} renders each (Django test client, SQLite)")
        for path in PAGES:
            print(line(f"baseline (0 jobs)  {path}", results[("baseline", path)]))
            print(line(f"{args.jobs} jobs  {path}", results[("loaded", path)]))
            with CaptureQueriesContext(connection) as queries:
                client.get(path)
            print(f"{'':<38} {len(queries)} SQL queries")
        loaded = sorted(results[("loaded", "/")])
        p95 = loaded[min(len(loaded) - 1, int(0.95 * len(loaded)))]
        print(f"target dashboard ≤ 200 ms with {args.jobs} jobs: {'met' if p95 <= 200 else 'NOT met'} (p95 {p95:.1f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
