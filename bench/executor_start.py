"""Submit → training started through our own executor and through Slurm, in the same run.

    sudo python bench/executor_start.py --jobs 5 [--json out.json]

Starts a throwaway Redis, a fresh SQLite database, ``manage.py scheduler``, daphne (the
relays report to it) and, one after the other: ``gpu_worker`` (1 simulated GPU; the local
executor, with the zygote as on simulated nodes by default, and again with a fresh
interpreter per job), then ``slurm_agent`` on a real one-node Slurm
(tests/integration/slurm.py: slurm-wlm + munge, as root). The same tiny jobs are submitted
one after another through the REST API; the timeline comes from JobEvents: submitted →
running → (slurm_submitted → slurm_running →) training_started → succeeded. Prints medians.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
WORK = Path(tempfile.mkdtemp(prefix="yp-bench-exec-"))
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
resources: {{gpu: 1, memory: 4Gi, cpu: "1"}}
user: vision
allow_duplicate: true
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args: list[str], env: dict, log: str) -> subprocess.Popen:
    return subprocess.Popen(args, cwd=ROOT, env=env, stdout=open(WORK / log, "ab"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        try:
            os.killpg(p.pid, 9)
        except ProcessLookupError:
            pass
        p.wait()


def timeline(label: str, jobs: int, node_name: str) -> dict:
    from django.contrib.auth import get_user_model

    from apps.cluster.models import Node
    from apps.jobs.models import JobEvent
    from tests.conftest import api_client

    deadline = time.time() + 120
    while not Node.objects.filter(name=node_name).exists():
        if time.time() > deadline:
            raise SystemExit(f"{label}: node {node_name} did not register (see {WORK})")
        time.sleep(0.2)
    time.sleep(4)  # a zygote finishes preloading; an agent's first sync
    client = api_client(get_user_model().objects.get(username="alice"))
    rows = []
    for i in range(jobs):
        response = client.post("/api/v1/jobs/", SPEC.format(i=f"{label}-{i}"), content_type="application/yaml")
        assert response.status_code == 201, response.content
        job_id = response.json()["id"]
        while not JobEvent.objects.filter(job_id=job_id, kind__in=TERMINAL).exists():
            time.sleep(0.05)
        events = {e.kind: e.created_at.timestamp() for e in JobEvent.objects.filter(job_id=job_id)}
        assert "succeeded" in events, (label, events)
        row = {"to_running_s": events["running"] - events["submitted"],
               "to_training_s": events["training_started"] - events["submitted"],
               "to_done_s": events["succeeded"] - events["submitted"]}
        if "slurm_submitted" in events:
            row["sbatch_to_slurm_running_s"] = events["slurm_running"] - events["slurm_submitted"]
            row["slurm_running_to_training_s"] = events["training_started"] - events["slurm_running"]
        rows.append(row)
    Node.objects.all().delete()
    return {key: round(statistics.median(r[key] for r in rows), 3) for key in rows[0]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args()
    from tests.integration.slurm import start_slurm

    cluster = start_slurm()
    if cluster is None:
        raise SystemExit("needs Slurm (slurm-wlm + munge) and root")
    call_command("migrate", verbosity=0)
    call_command("demo_setup", verbosity=0, stdout=open(os.devnull, "w"))
    results: dict = {"jobs": args.jobs}
    with RedisServer(data_dir=WORK / "redis") as server:
        settings.REDIS_URL = server.url
        settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"][0]["address"] = server.url
        port = free_port()
        env = dict(os.environ, REDIS_URL=server.url, SCHEDULER_TICK_S="1", HEARTBEAT_S="1", PYTHONUNBUFFERED="1",
                   **cluster.env())
        base = [start([sys.executable, "manage.py", "scheduler"], env, "scheduler.log"),
                start([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                       "yoloportal.asgi:application"], env, "web.log")]
        try:
            for label, preload in (("local_zygote", "true"), ("local_fresh_interpreter", "false")):
                worker = start([sys.executable, "manage.py", "gpu_worker", "--name", label.replace("_", "-"),
                                "--simulate-gpus", "1"], dict(env, TRAINER_PRELOAD=preload), f"{label}.log")
                try:
                    results[label] = timeline(label, args.jobs, label.replace("_", "-"))
                finally:
                    stop([worker])
            agent = start([sys.executable, "manage.py", "slurm_agent"], dict(
                env, SLURM_PORTAL_URL=f"http://127.0.0.1:{port}", SLURM_PARTITION=cluster.partition,
                SLURM_SIMULATED_GPUS="true", SLURM_POLL_S="0.3", SLURM_SYNC_S="1"), "slurm_agent.log")
            try:
                results["slurm"] = timeline("slurm", args.jobs, cluster.node)
            finally:
                stop([agent])
        finally:
            stop(base)
    report(results, args.json)
    cluster.resume()
    cluster.stop()


def report(results: dict, json_path: str | None) -> None:
    args_jobs = results["jobs"]
    print(f"{'median over ' + str(args_jobs) + ' jobs':26} {'→ running':>10} {'→ training':>11} {'→ done':>8}")
    for name in ("local_zygote", "local_fresh_interpreter", "slurm"):
        r = results[name]
        print(f"{name:26} {r['to_running_s']:>9.2f}s {r['to_training_s']:>10.2f}s {r['to_done_s']:>7.2f}s")
    s = results["slurm"]
    print(f"slurm: sbatch → Slurm running {s['sbatch_to_slurm_running_s']:.2f}s, "
          f"Slurm running → training {s['slurm_running_to_training_s']:.2f}s")
    for name in ("local_zygote", "local_fresh_interpreter"):
        results[f"slurm_vs_{name}"] = round(s["to_training_s"] / results[name]["to_training_s"], 2)
        print(f"submit → training started: Slurm {results[f'slurm_vs_{name}']}x {name}")
    if json_path:
        Path(json_path).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
