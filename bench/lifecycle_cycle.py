"""How long a fine-tune + val + export cycle takes on the demo data, through the portal and directly.

    python bench/lifecycle_cycle.py --runs 3 [--json out.json]

Starts a throwaway Redis, `manage.py scheduler` and `manage.py gpu_worker` (1 simulated GPU,
CPU training, the zygote) against a fresh SQLite database. Uploads weights saved from a model
built from yolov8n.yaml (nothing downloaded), then per run submits through the REST API:

1. a fine-tune from those weights: ``yolo train data=demo model=base.pt epochs=1 imgsz=64``,
2. ``yolo val`` of the version it registered, 3. ``yolo export format=onnx`` of it (verified
   by onnxruntime against the PyTorch outputs),

each one after the previous finished, and times submit → succeeded of each and of the whole
cycle. The baseline, measured in the same run, is the same three steps done directly with
Ultralytics in one process (no queue, no checks, no verification, no registry). Prints the
medians and the ratio portal / direct.
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
WORK = Path(tempfile.mkdtemp(prefix="yp-bench-life-"))
os.environ["DATA_DIR"] = str(WORK)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "yoloportal.settings")
os.environ.setdefault("YOLO_OFFLINE", "1")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402

from apps.core.redis_server import RedisServer  # noqa: E402

TERMINAL = ("succeeded", "failed", "cancelled", "timed_out")
TRAIN = "yolo train data=demo model=base.pt epochs=1 imgsz=64 batch=8"


def submit(client, command: str, name: str) -> str:
    body = {"task_name": name, "command": command, "user": "vision", "allow_duplicate": True,
            "resources": {"gpu": 1}, "timeout": 3600}
    response = client.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def wait(job_id: str) -> float:
    """Seconds from submit to the job's terminal event."""
    from apps.jobs.models import JobEvent

    while not JobEvent.objects.filter(job_id=job_id, kind__in=TERMINAL).exists():
        time.sleep(0.05)
    events = {e.kind: e.created_at.timestamp() for e in JobEvent.objects.filter(job_id=job_id)}
    assert "succeeded" in events, (job_id, sorted(events))
    return events["succeeded"] - events["submitted"]


def portal_cycle(client, index: int) -> dict:
    from apps.registry.models import Export, ModelVersion

    started = time.monotonic()
    tune = submit(client, TRAIN, f"bench-tune-{index}")
    tune_s = wait(tune)
    version = ModelVersion.objects.get(job_id=tune)
    val_s = wait(submit(client, f"yolo val model={version.reference} data=demo imgsz=64", f"bench-val-{index}"))
    export_id = submit(client, f"yolo export model={version.reference} format=onnx imgsz=64", f"bench-export-{index}")
    export_s = wait(export_id)
    check = Export.objects.get(job_id=export_id).verification
    return {"fine_tune_s": tune_s, "val_s": val_s, "export_s": export_s, "cycle_s": time.monotonic() - started,
            "onnx_max_abs": check["max_abs"], "onnx_max_rel": check["max_rel"]}


def direct_cycle(weights: Path, data: Path, index: int) -> dict:
    """The baseline: the same steps with Ultralytics in a fresh interpreter (as the portal's child is)."""
    script = f"""
import json, time
from ultralytics import YOLO
t0 = time.monotonic()
model = YOLO({str(weights)!r})
model.train(data={str(data)!r}, epochs=1, imgsz=64, batch=8, workers=0, device="cpu", plots=False,
            project={str(WORK / 'direct')!r}, name="run{index}", exist_ok=True, verbose=False)
t1 = time.monotonic()
best = YOLO(str(model.trainer.best))
best.val(data={str(data)!r}, imgsz=64, device="cpu", plots=False, verbose=False,
         project={str(WORK / 'direct')!r}, name="val{index}", exist_ok=True)
t2 = time.monotonic()
best.export(format="onnx", imgsz=64)
t3 = time.monotonic()
print(json.dumps({{"fine_tune_s": t1 - t0, "val_s": t2 - t1, "export_s": t3 - t2, "cycle_s": t3 - t0}}))
"""
    env = dict(os.environ, YOLO_CONFIG_DIR=str(WORK / "direct-config"), YOLO_AUTOINSTALL="false")
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["cycle_s"] = time.monotonic() - started  # with interpreter start, as a job has
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    call_command("demo_setup", verbosity=0, stdout=open(os.devnull, "w"))
    from django.contrib.auth import get_user_model
    from ultralytics import YOLO

    from apps.datasets.models import Dataset
    from apps.registry.services import shared_weights_add
    from tests.conftest import api_client

    base = WORK / "base.pt"
    YOLO("yolov8n.yaml").save(str(base))
    shared_weights_add(source=base)
    data = Path(settings.DATASETS_DIR) / Dataset.objects.filter(name="demo").first().yaml_key.removeprefix("datasets/")
    with RedisServer(data_dir=WORK / "redis") as server:
        settings.REDIS_URL = server.url
        settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"][0]["address"] = server.url
        env = dict(os.environ, REDIS_URL=server.url, SCHEDULER_TICK_S="1", HEARTBEAT_S="1", PYTHONUNBUFFERED="1")
        logs = open(WORK / "processes.log", "ab")
        procs = [subprocess.Popen([sys.executable, "manage.py", *a], cwd=ROOT, env=env, stdout=logs,
                                  stderr=subprocess.STDOUT, start_new_session=True)
                 for a in (["scheduler"], ["gpu_worker", "--name", "bench", "--simulate-gpus", "1"])]
        try:
            from apps.cluster.models import Node

            deadline = time.time() + 120
            while not Node.objects.filter(name="bench").exists() and time.time() < deadline:
                time.sleep(0.2)
            time.sleep(3)  # the zygote preloads torch
            client = api_client(get_user_model().objects.get(username="alice"))
            portal, direct = [], []
            for index in range(args.runs):  # interleaved, so both see the same machine load
                portal.append(portal_cycle(client, index))
                direct.append(direct_cycle(base, data, index))
        finally:
            for p in procs:
                try:
                    os.killpg(p.pid, 9)
                except ProcessLookupError:
                    pass
                p.wait()
    median = lambda rows, key: round(statistics.median(r[key] for r in rows), 2)  # noqa: E731
    results = {"runs": args.runs, "load_avg_1m": round(os.getloadavg()[0], 1),
               "portal": {k: median(portal, k) for k in ("fine_tune_s", "val_s", "export_s", "cycle_s")},
               "direct_baseline": {k: median(direct, k) for k in ("fine_tune_s", "val_s", "export_s", "cycle_s")},
               "onnx_max_abs": max(r["onnx_max_abs"] for r in portal),
               "onnx_max_rel": max(r["onnx_max_rel"] for r in portal)}
    results["ratio_cycle"] = round(results["portal"]["cycle_s"] / results["direct_baseline"]["cycle_s"], 2)
    print(f"median over {args.runs} runs (load avg {results['load_avg_1m']})  fine-tune     val  export   cycle")
    for name in ("portal", "direct_baseline"):
        r = results[name]
        print(f"{name:42} {r['fine_tune_s']:>8.1f}s {r['val_s']:>6.1f}s {r['export_s']:>6.1f}s {r['cycle_s']:>6.1f}s")
    print(f"portal / direct: {results['ratio_cycle']}x; ONNX vs PyTorch raw outputs: max abs "
          f"{results['onnx_max_abs']:.3g}, max rel {results['onnx_max_rel']:.3g}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
