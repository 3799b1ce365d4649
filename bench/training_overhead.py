"""Training through the portal against the same training run directly with Ultralytics.

    python bench/training_overhead.py [--epochs 4] [--repeat 2] [--gpu] [--json out.json]

Both train the generated demo dataset with the same arguments (yolov8n.yaml from
scratch, imgsz 64, batch 8, workers 0, CPU, plots off — what the portal forces) for
``--epochs`` epochs. Portal: a job on a throwaway stack (common.Stack: web, scheduler, one
worker with one simulated GPU, the zygote as by default); its epochs end when its metric
rows are written, the whole from ``submitted`` to ``succeeded``. Direct: a fresh
``python`` running ``YOLO(model).train(...)`` (what ``yolo train`` runs) with a callback
that prints when each epoch ends, the whole from process start to exit. Per-epoch time =
the median gap between consecutive epoch ends; fixed overhead = total − epochs × per-epoch.
Medians of ``--repeat`` runs, alternating portal and direct so both see the same load.

``--gpu`` (a node with an NVIDIA GPU): the worker registers the real GPUs, both train on GPU 0
at imgsz 320, batch 16 (``GPU_ARGS``), and the web server is Daphne.
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

from common import Stack, http_post_json, machine, median, rounded
from job_latency import events_of, wait_for_node

ARGS = "model=yolov8n.yaml imgsz=64 batch=8 workers=0"
GPU_ARGS = "model=yolov8n.yaml imgsz=320 batch=16 workers=0"


DIRECT = """
import sys, time
from ultralytics import YOLO
model = YOLO("yolov8n.yaml")
# Ultralytics' final validation of best.pt runs on_fit_epoch_end once more, as epoch
# ``epochs`` (one past the last): not an epoch end (the portal's worker skips it too: worker/train_child.py).
model.add_callback("on_fit_epoch_end", lambda trainer: trainer.epoch < trainer.epochs
                   and print("EPOCH_END", time.time(), flush=True))
args = dict(arg.split("=", 1) for arg in sys.argv[5].split())
model.train(data=sys.argv[1], epochs=int(sys.argv[2]), imgsz=int(args["imgsz"]), batch=int(args["batch"]), workers=0,
            device=sys.argv[4], plots=False, project=sys.argv[3], name="run", exist_ok=True)
"""


def portal_run(base: str, token: str, epochs: int, n: int, args: str) -> tuple[float, list[float]]:
    from apps.jobs.models import MetricPoint

    status, body = http_post_json(base + "/api/v1/jobs/", token, {
        "task_name": f"overhead-{epochs}-{n}", "allow_duplicate": True, "team": "vision",
        "command": f"yolo train data=demo {args} epochs={epochs}", "resources": {"gpu": 1}, "timeout": 3600})
    if status != 201:
        raise RuntimeError(f"submit: {status} {body}")
    events = events_of(body["id"], timeout=3600)
    ends = sorted(t.timestamp() for t in MetricPoint.objects.filter(job_id=body["id"]).values_list("created_at", flat=True))
    return events["succeeded"] - events["submitted"], ends


def direct_run(data_yaml: str, epochs: int, env: dict, device: str, args: str) -> tuple[float, list[float]]:
    with tempfile.TemporaryDirectory(prefix="yp-bench-direct-") as folder:
        started = time.time()
        result = subprocess.run([sys.executable, "-c", DIRECT, data_yaml, str(epochs), folder, device, args], cwd=folder, env=env,
                                capture_output=True, text=True, timeout=3600)
        elapsed = time.time() - started
        if result.returncode != 0:
            raise RuntimeError(f"direct training failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
        ends = [float(line.split()[1]) for line in result.stdout.splitlines() if line.startswith("EPOCH_END")]
        return elapsed, ends


def per_epoch(ends: list[float]) -> float:
    return median([b - a for a, b in zip(ends, ends[1:], strict=False)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--gpu", action="store_true", help="train on the node's real GPU 0 (NVIDIA) at imgsz 320")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    train_args, device = (GPU_ARGS, "0") if args.gpu else (ARGS, "cpu")

    runs: dict[str, list[dict]] = {"portal": [], "direct": []}
    with Stack("overhead") as stack:
        token = stack.prepare()
        stack.django()
        from django.contrib.auth import get_user_model

        from apps.accounts.models import Team
        from apps.core.artifacts import artifact_path
        from apps.datasets.selectors import dataset_resolve

        get_user_model()  # apps ready
        data_yaml = str(artifact_path(dataset_resolve(team=Team.objects.get(slug="vision"), reference="demo").yaml_key))
        env = {k: v for k, v in stack.env.items() if not k.startswith(("DJANGO", "DATABASE", "REDIS"))}
        env.update({"YOLO_OFFLINE": "1", "YOLO_AUTOINSTALL": "false", "CUDA_VISIBLE_DEVICES": "0" if args.gpu else "",
                    "YOLO_CONFIG_DIR": str(stack.dir / "yolo-config"), "PATH": os.environ.get("PATH", "")})
        base = stack.start_web(server="daphne") if args.gpu else stack.start_web(workers=1)
        stack.start_scheduler()
        stack.start_worker(gpus=None if args.gpu else 1, name="bench-overhead")
        wait_for_node("bench-overhead")
        time.sleep(5)
        portal_run(base, token, 1, -1, train_args)  # warm: dataset label cache, first imports
        direct_run(data_yaml, 1, env, device, train_args)
        for n in range(args.repeat):
            for name, run in (("portal", lambda n=n: portal_run(base, token, args.epochs, n, train_args)),
                              ("direct", lambda: direct_run(data_yaml, args.epochs, env, device, train_args))):
                total, ends = run()
                if len(ends) != args.epochs:
                    raise RuntimeError(f"{name}: {len(ends)} epoch ends for {args.epochs} epochs")
                epoch = per_epoch(ends)
                runs[name].append({"total_s": total, "per_epoch_s": epoch, "fixed_s": total - args.epochs * epoch})
    fig = {name: {key: median([r[key] for r in rs]) for key in ("total_s", "per_epoch_s", "fixed_s")}
           for name, rs in runs.items()}
    p, d = fig["portal"], fig["direct"]
    result = {"machine": machine(), "args": train_args, "device": "cuda:0" if args.gpu else "cpu", "epochs": args.epochs, "repeat": args.repeat,
              "portal_total_s": rounded(p["total_s"], 2), "direct_total_s": rounded(d["total_s"], 2),
              "portal_per_epoch_s": rounded(p["per_epoch_s"], 2), "direct_per_epoch_s": rounded(d["per_epoch_s"], 2),
              "per_epoch_ratio": rounded(p["per_epoch_s"] / d["per_epoch_s"], 2),
              "portal_fixed_s": rounded(p["fixed_s"], 2), "direct_fixed_s": rounded(d["fixed_s"], 2),
              "fixed_overhead_s": rounded(p["fixed_s"] - d["fixed_s"], 2),
              "runs": {name: [{k: rounded(v, 2) for k, v in r.items()} for r in rs] for name, rs in runs.items()}}
    print(f"per epoch: portal {p['per_epoch_s']:.2f} s, direct {d['per_epoch_s']:.2f} s "
          f"(ratio {p['per_epoch_s'] / d['per_epoch_s']:.2f}); fixed: portal {p['fixed_s']:.2f} s (submit → done), "
          f"direct {d['fixed_s']:.2f} s (process start → exit)")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
