"""Submit → start latency of tiny training jobs on the live system, with and without the zygote.

    python bench/job_latency.py --jobs 8 [--json out.json]

Starts a throwaway Redis, `manage.py scheduler` and `manage.py gpu_worker` (1 simulated
GPU) against a fresh SQLite database, submits the jobs one after another through the
REST API (in-process Django test client) and reads the timeline from JobEvents:
submitted → running (the worker's fenced start) → training_started (Ultralytics is
training) → succeeded. Runs once with TRAINER_PRELOAD=false (a fresh interpreter per job,
the baseline) and once with the zygote, and prints medians and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
WORK = Path(tempfile.mkdtemp(prefix="yp-bench-"))
os.environ["DATA_DIR"] = str(WORK)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "yoloportal.settings")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402

from apps.core.redis_server import RedisServer  # noqa: E402

TERMINAL = ("succeeded", "failed", "cancelled", "timed_out")
SPEC = """\
task_name: bench-{i}
command: "yolo train data=demo model=yolov8n.yaml epochs=1 imgsz=64 fraction=0.25"
resources: {{gpu: 1}}
user: vision
allow_duplicate: true
"""


def run(preload: str, jobs: int, redis_url: str) -> dict:
    from apps.jobs.models import JobEvent
    from tests.conftest import api_client

    env = dict(os.environ, REDIS_URL=redis_url, TRAINER_PRELOAD=preload, SCHEDULER_TICK_S="1",
               HEARTBEAT_S="1", PYTHONUNBUFFERED="1")
    logs = open(WORK / f"processes-{preload}.log", "ab")
    procs = [subprocess.Popen([sys.executable, "manage.py", *args], cwd=ROOT, env=env, stdout=logs,
                              stderr=subprocess.STDOUT, start_new_session=True)
             for args in (["scheduler"], ["gpu_worker", "--name", f"bench-{preload}", "--simulate-gpus", "1"])]
    try:
        from apps.cluster.models import Node

        deadline = time.time() + 120
        while not Node.objects.filter(name=f"bench-{preload}").exists() and time.time() < deadline:
            time.sleep(0.2)
        time.sleep(3 if preload == "true" else 0)  # let the zygote finish preloading
        from django.contrib.auth import get_user_model

        client = api_client(get_user_model().objects.get(username="alice"))
        rows = []
        for i in range(jobs):
            response = client.post("/api/v1/jobs/", SPEC.format(i=f"{preload}-{i}"),
                                   content_type="application/yaml")
            assert response.status_code == 201, response.content
            job_id = response.json()["id"]
            # The terminal event is written just after the state changes: wait for the event.
            while not JobEvent.objects.filter(job_id=job_id, kind__in=TERMINAL).exists():
                time.sleep(0.05)
            events = {e.kind: e.created_at.timestamp() for e in JobEvent.objects.filter(job_id=job_id)}
            assert "succeeded" in events, events
            rows.append({
                "to_running_s": events["running"] - events["submitted"],
                "to_training_s": events["training_started"] - events["submitted"],
                "to_done_s": events["succeeded"] - events["submitted"],
            })
        return {key: round(statistics.median(r[key] for r in rows), 3) for key in rows[0]}
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, 9)
            except ProcessLookupError:
                pass
            p.wait()
        Node.objects.all().delete()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--json")
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    call_command("demo_setup", verbosity=0, stdout=open(os.devnull, "w"))
    with RedisServer(data_dir=WORK / "redis") as server:
        settings.REDIS_URL = server.url
        settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"][0]["address"] = server.url
        results = {"baseline_fresh_interpreter": run("false", args.jobs, server.url),
                   "zygote": run("true", args.jobs, server.url)}
    base, fast = results["baseline_fresh_interpreter"], results["zygote"]
    results["ratio_to_training"] = round(base["to_training_s"] / fast["to_training_s"], 2)
    results["jobs"] = args.jobs
    print(f"{'median over ' + str(args.jobs) + ' jobs':32} {'→ running':>10} {'→ training':>11} {'→ done':>8}")
    for name in ("baseline_fresh_interpreter", "zygote"):
        r = results[name]
        print(f"{name:32} {r['to_running_s']:>9.2f}s {r['to_training_s']:>10.2f}s {r['to_done_s']:>7.2f}s")
    print(f"submit → training started: {results['ratio_to_training']}x faster with the zygote")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
