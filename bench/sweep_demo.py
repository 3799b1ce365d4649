"""A hyperparameter sweep on the demo data through the whole stack, with Ultralytics training.

    python bench/sweep_demo.py [--trials 8] [--parallel 2] [--gpus 2] [--epochs 4] [--imgsz 128]
                               [--base-epochs 30] [--prune median] [--json out.json]

Starts a throwaway Redis, ``manage.py scheduler`` and ``manage.py gpu_worker`` (``--gpus``
simulated GPUs: CPU training, the zygote) against a fresh SQLite database with the demo
teams and dataset (``manage.py demo_setup``), submits one TPE sweep through the REST API
(lr0 on a log range, momentum, weight decay; median pruning) and waits for it to end.

The trials fine-tune ``base.pt`` (shared weights): ``--base-epochs`` epochs of yolov8n.yaml
trained directly with Ultralytics on the demo data first (not timed; 0 = the untrained
model). Nothing is downloaded, and a few epochs from scratch on 32 images leave every
trial at mAP 0 (Ultralytics warms up over at least 100 iterations), so a search from
scratch would have nothing to compare. Trials and base train with ``warmup_epochs=0`` so
``lr0`` acts from the first iteration, and ``nbs=8`` (= batch): Ultralytics accumulates
gradients up to its nominal batch of 64 before each optimizer step, which on 32 images is
one step every two epochs — a 4-epoch trial would take 2 steps, and its epoch-1 metric would
be the base's own.

Prints the wall time (submit → the sweep's end), every trial (parameters, state, metric,
epochs run, when and why it was pruned), the best parameters and the version registered.
The baseline, from the same run: the epochs the same trials would have trained without
pruning (trials × epochs) against the epochs trained, and the trials' summed run time
(what running them one after another, each at the speed it had here, would take).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
WORK = Path(tempfile.mkdtemp(prefix="yp-bench-sweep-"))
os.environ["DATA_DIR"] = str(WORK)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "yoloportal.settings")
os.environ.setdefault("YOLO_OFFLINE", "1")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402

from apps.core.redis_server import RedisServer  # noqa: E402

TERMINAL = ("succeeded", "failed", "cancelled", "timed_out")


def sweep_spec(args) -> dict:
    prune = {"method": "median", "startup_trials": 2, "warmup_epochs": 1} if args.prune == "median" else (
        {"method": "asha", "min_epochs": 1, "reduction_factor": 2} if args.prune == "asha" else None)
    return {
        "task_name": "demo-sweep", "user": "vision", "resources": {"gpu": 1}, "timeout": 3600,
        "command": f"yolo train data=demo model=base.pt epochs={args.epochs} imgsz={args.imgsz} batch=8 "
                   f"nbs=8 optimizer=SGD warmup_epochs=0 workers=0",
        "sweep": {"method": "tpe", "trials": args.trials, "parallel": args.parallel, "seed": args.seed,
                  "metric": "metrics/mAP50-95(B)", "prune": prune,
                  "parameters": {"lr0": {"low": 1e-4, "high": 1e-1, "log": True},
                                 "momentum": {"low": 0.6, "high": 0.98},
                                 "weight_decay": {"low": 1e-5, "high": 1e-2, "log": True}}},
    }


BASE_MAP: dict = {}


def base_train(data: Path, args) -> float:
    """``WORK/base.pt``: yolov8n.yaml, trained ``--base-epochs`` on the demo data in a fresh interpreter."""
    script = f"""
import json, shutil
from ultralytics import YOLO
model = YOLO("yolov8n.yaml")
if {args.base_epochs} > 0:
    model.train(data={str(data)!r}, epochs={args.base_epochs}, imgsz={args.imgsz}, batch=8, nbs=8, optimizer="SGD",
                lr0=0.01, warmup_epochs=0, workers=0, device="cpu", plots=False, verbose=False, amp=False,
                project={str(WORK / 'base')!r}, name="run", exist_ok=True)
    shutil.copy(model.trainer.best, {str(WORK / 'base.pt')!r})
    print(json.dumps({{"map": model.trainer.metrics.get("metrics/mAP50-95(B)")}}))
else:
    model.save({str(WORK / 'base.pt')!r})
    print(json.dumps({{"map": None}}))
"""
    env = dict(os.environ, YOLO_CONFIG_DIR=str(WORK / "base-config"), YOLO_AUTOINSTALL="false")
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    BASE_MAP["value"] = json.loads(out.stdout.strip().splitlines()[-1])["map"]
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--imgsz", type=int, default=128)
    parser.add_argument("--base-epochs", type=int, default=30)
    parser.add_argument("--base", help="a .pt to fine-tune instead of training base.pt here")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--prune", choices=["median", "asha", "none"], default="median")
    parser.add_argument("--json")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so `finally` stops the processes it started
    call_command("migrate", verbosity=0)
    call_command("demo_setup", verbosity=0, stdout=open(os.devnull, "w"))
    from django.contrib.auth import get_user_model

    from apps.datasets.models import Dataset
    from apps.jobs.models import Job, JobEvent
    from apps.registry.services import shared_weights_add
    from apps.sweeps.models import Trial
    from tests.conftest import api_client

    data = Path(settings.DATASETS_DIR) / Dataset.objects.filter(name="demo").first().yaml_key.removeprefix("datasets/")
    if args.base:
        shutil.copy(args.base, WORK / "base.pt")
        print(f"base.pt: {args.base}", flush=True)
    else:
        base_s = base_train(data, args)
        print(f"base.pt: yolov8n.yaml trained {args.base_epochs} epochs on the demo data in {base_s:.0f} s "
              f"(mAP50-95 {BASE_MAP.get('value')})", flush=True)
    shared_weights_add(source=WORK / "base.pt")
    with RedisServer(data_dir=WORK / "redis") as server:
        settings.REDIS_URL = server.url
        settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"][0]["address"] = server.url
        settings.CACHES["default"]["LOCATION"] = server.url  # the API's throttles count there
        env = dict(os.environ, REDIS_URL=server.url, SCHEDULER_TICK_S="1", HEARTBEAT_S="1", PYTHONUNBUFFERED="1")
        logs = open(WORK / "processes.log", "ab")
        procs = [subprocess.Popen([sys.executable, "manage.py", *a], cwd=ROOT, env=env, stdout=logs,
                                  stderr=subprocess.STDOUT, start_new_session=True)
                 for a in (["scheduler"], ["gpu_worker", "--name", "bench", "--simulate-gpus", str(args.gpus)])]
        try:
            from apps.cluster.models import Node

            deadline = time.time() + 120
            while not Node.objects.filter(name="bench").exists() and time.time() < deadline:
                time.sleep(0.2)
            time.sleep(3)  # the zygote preloads torch
            client = api_client(get_user_model().objects.get(username="alice"))
            started = time.monotonic()
            response = client.post("/api/v1/jobs/", sweep_spec(args), format="json")
            assert response.status_code == 201, response.content
            parent_id = response.json()["id"]
            while Job.objects.get(pk=parent_id).state not in TERMINAL:
                time.sleep(0.5)
            wall_s = time.monotonic() - started
            table = client.get(f"/api/v1/jobs/{parent_id}/sweep/").json()
        finally:
            for p in procs:
                try:
                    os.killpg(p.pid, 9)
                except ProcessLookupError:
                    pass
                p.wait()
    parent = Job.objects.get(pk=parent_id)
    trials = list(Trial.objects.filter(sweep=parent).select_related("job").order_by("number"))
    run_s = sum((t.job.finished_at - t.job.first_started_at).total_seconds() for t in trials
                if t.job and t.job.first_started_at and t.job.finished_at)
    trained = sum(t.job.epochs_done for t in trials if t.job)
    ended = JobEvent.objects.filter(job=parent, kind=parent.state).first()
    results = {
        "state": parent.state, "wall_s": round(wall_s, 1), "trials": len(trials), "parallel": args.parallel,
        "gpus": args.gpus, "epochs": args.epochs, "imgsz": args.imgsz, "base_epochs": args.base_epochs,
        "base_map50_95": BASE_MAP.get("value"), "load_avg_1m": round(os.getloadavg()[0], 1),
        "pruned": [{"trial": t.number, "epoch": t.pruned_epoch, "why": t.note} for t in trials if t.pruned],
        "epochs_trained": trained, "epochs_without_pruning": len(trials) * args.epochs,
        "trials_run_time_sum_s": round(run_s, 1), "best": table["best"], "message": ended.message if ended else "",
        "rows": [{k: r[k] for k in ("number", "params", "state", "value", "epochs_done", "pruned_epoch")}
                 for r in table["rows"]],
    }
    print(f"sweep {parent.state} in {wall_s:.0f} s wall ({len(trials)} trials, {args.parallel} at once on "
          f"{args.gpus} simulated GPUs, epochs {args.epochs}, imgsz {args.imgsz}, load avg {results['load_avg_1m']})")
    for row in results["rows"]:
        params = " ".join(f"{k}={v:.3g}" for k, v in row["params"].items())
        value = f"{row['value']:.4f}" if row["value"] is not None else "-"
        pruned = f" pruned at epoch {row['pruned_epoch']}" if row["pruned_epoch"] else ""
        print(f"  trial {row['number']}: {params}  {row['state']}  mAP50-95 {value}  epochs {row['epochs_done']}{pruned}")
    print(f"pruned {len(results['pruned'])}: " + "; ".join(p["why"] for p in results["pruned"]))
    print(f"epochs trained {trained} of {results['epochs_without_pruning']} without pruning; trials' run time "
          f"summed {run_s:.0f} s vs {wall_s:.0f} s wall")
    if table["best"]:
        print(f"best: trial {table['best']['number']} {table['best']['params']} -> {table['best']['value']:.4f} "
              f"({table['best'].get('model_reference')})")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    print(f"work folder (delete when done; its base.pt can be passed to --base): {WORK}")


if __name__ == "__main__":
    main()
