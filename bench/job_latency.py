"""How soon training starts: idle submit → training process started, and GPU freed → the
next job's training process started; Slurm's in the same run as the baseline.

    python bench/job_latency.py [--jobs 5] [--chain 6] [--slurm] [--json out.json]

A throwaway stack (common.Stack): web (uvicorn), ``manage.py scheduler`` and one
``manage.py gpu_worker`` with one simulated GPU, real Ultralytics training of 1 epoch on
the generated demo data (imgsz 64). Times come from the job's events (one clock: this
machine): ``submitted`` (the API committed it), ``running`` (the worker's fenced start,
just before it forks the training process), ``training_started`` (Ultralytics reports
its first epoch starting) and the end of the previous job (its terminal event: the GPU is
free).

- idle: ``--jobs`` jobs one after another on an idle cluster, each waited for; with the
  zygote (the default on simulated nodes: TRAINER_PRELOAD=auto) and, as the in-run
  baseline, a fresh interpreter per job (TRAINER_PRELOAD=false);
- freed: ``--chain`` jobs submitted at once to the one GPU: each next one starts when the
  previous one ends (``--chain`` − 1 samples, p95 = the largest but one when few);
- Slurm (``--slurm``, a private one-node Slurm like ../shared/recipes/slurm-single-node.sh):
  ``sbatch`` → the job script's first line runs, and a whole-node job's end → the next
  whole-node job's first line.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from common import Slurm, Stack, http_post_json, machine, median, percentile, rounded

TERMINAL = ("succeeded", "failed", "cancelled", "timed_out")
COMMAND = "yolo train data=demo model=yolov8n.yaml epochs=1 imgsz=64 batch=8 workers=0"


def spec(name: str) -> dict:
    return {"task_name": name, "allow_duplicate": True, "team": "vision", "command": COMMAND,
            "resources": {"gpu": 1}, "timeout": 1800}


def events_of(job_id: str, timeout: float = 900) -> dict[str, float]:
    from apps.jobs.models import JobEvent

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = list(JobEvent.objects.filter(job_id=job_id).values_list("kind", "created_at"))
        if any(kind in TERMINAL for kind, _ in rows):
            events = {}
            for kind, at in rows:
                events.setdefault(kind, at.timestamp())  # the first of each kind
            if "succeeded" not in events:
                raise RuntimeError(f"job {job_id} did not succeed: {sorted(events)}")
            return events
        time.sleep(0.2)
    raise RuntimeError(f"job {job_id} did not finish in {timeout:.0f} s")


def wait_for_node(name: str) -> None:
    from apps.cluster.models import Node

    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if Node.objects.filter(name=name).exists():
            return
        time.sleep(0.3)
    raise RuntimeError(f"worker {name} did not register")


def submit(base: str, token: str, name: str) -> str:
    status, body = http_post_json(base + "/api/v1/jobs/", token, spec(name))
    if status != 201:
        raise RuntimeError(f"submit: {status} {body}")
    return body["id"]


def idle_runs(stack: Stack, base: str, token: str, preload: str, jobs: int) -> dict:
    worker = stack.start_worker(gpus=1, name=f"bench-{preload}", TRAINER_PRELOAD=preload)
    wait_for_node(f"bench-{preload}")
    time.sleep(5 if preload == "true" else 1)  # the zygote finishes preloading
    rows = []
    try:
        submit_and_wait(base, token, f"warm-{preload}")  # first-run caches (dataset labels, fonts)
        for i in range(jobs):
            e = submit_and_wait(base, token, f"idle-{preload}-{i}")
            rows.append({"to_running_s": e["running"] - e["submitted"],
                         "to_training_s": e["training_started"] - e["submitted"]})
    finally:
        stack.stop_process(f"worker-bench-{preload}")
        del worker
    return {key: rounded(median([r[key] for r in rows]), 3) for key in rows[0]} | {"samples": rows}


def submit_and_wait(base: str, token: str, name: str) -> dict[str, float]:
    return events_of(submit(base, token, name))


def freed_runs(stack: Stack, base: str, token: str, chain: int) -> dict:
    stack.start_worker(gpus=1, name="bench-chain", TRAINER_PRELOAD="true")
    wait_for_node("bench-chain")
    time.sleep(5)
    try:
        ids = [submit(base, token, f"chain-{i}") for i in range(chain)]
        timelines = [events_of(job_id) for job_id in ids]
    finally:
        stack.stop_process("worker-bench-chain")
    # One GPU: the jobs ran one after another, in start order.
    timelines.sort(key=lambda e: e["running"])
    to_running = [b["running"] - a["succeeded"] for a, b in zip(timelines, timelines[1:], strict=False)]
    to_training = [b["training_started"] - a["succeeded"] for a, b in zip(timelines, timelines[1:], strict=False)]
    return {"to_running_p95_s": rounded(percentile(to_running, 95), 3),
            "to_running_median_s": rounded(median(to_running), 3),
            "to_training_p95_s": rounded(percentile(to_training, 95), 3),
            "to_training_median_s": rounded(median(to_training), 3),
            "samples_to_running_s": [rounded(x, 3) for x in to_running]}


def slurm_runs(jobs: int, chain: int) -> dict:
    with Slurm() as slurm:
        marks = slurm.dir / "marks"
        marks.mkdir()
        idle = []
        for i in range(jobs + 1):
            started = time.time()
            result = slurm.sbatch("-J", f"idle-{i}", "--gres=gpu:1", "-t", "5", "-o", "/dev/null",
                                  "--wrap", f"date +%s.%N > {marks}/idle-{i}")
            if result.returncode != 0:
                raise RuntimeError(f"sbatch: {result.stderr}")
            mark = marks / f"idle-{i}"
            deadline = time.monotonic() + 120
            while not (mark.exists() and mark.read_text().strip()) and time.monotonic() < deadline:
                time.sleep(0.02)
            if i:  # the first one warms up
                idle.append(float(mark.read_text()) - started)
            slurm.cancel()
        for i in range(chain):  # whole-node jobs: each waits for the previous one's GPUs
            slurm.sbatch("-J", f"chain-{i}", "--gres=gpu:8", "-t", "5", "-o", "/dev/null", "--wrap",
                         f"date +%s.%N > {marks}/start-{i}; sleep 2; date +%s.%N > {marks}/end-{i}")
        deadline = time.monotonic() + 60 + 10 * chain
        while not (marks / f"end-{chain - 1}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.2)
        starts = sorted(float((marks / f"start-{i}").read_text()) for i in range(chain))
        ends = sorted(float((marks / f"end-{i}").read_text()) for i in range(chain))
        freed = [s - e for e, s in zip(ends, starts[1:], strict=False)]
    return {"idle_to_start_median_s": rounded(median(idle), 3), "freed_to_start_p95_s": rounded(percentile(freed, 95), 3),
            "freed_to_start_median_s": rounded(median(freed), 3), "samples_idle_s": [rounded(x, 3) for x in idle],
            "samples_freed_s": [rounded(x, 3) for x in freed]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--jobs", type=int, default=5)
    parser.add_argument("--chain", type=int, default=6)
    parser.add_argument("--slurm", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args(argv)

    result: dict = {"machine": machine(), "database": args.database, "command": COMMAND}
    with Stack(f"latency-{args.database}", args.database) as stack:
        token = stack.prepare()
        stack.django()
        base = stack.start_web(workers=2)
        stack.start_scheduler(SCHEDULER_TICK_S="3")
        result["idle_zygote"] = idle_runs(stack, base, token, "true", args.jobs)
        result["idle_fresh_interpreter"] = idle_runs(stack, base, token, "false", args.jobs)
        result["freed"] = freed_runs(stack, base, token, args.chain)
    if args.slurm and Slurm.available():
        result["slurm"] = slurm_runs(args.jobs, args.chain)
    z, f, fr = result["idle_zygote"], result["idle_fresh_interpreter"], result["freed"]
    print(f"idle submit → process started: {z['to_running_s']} s median (→ Ultralytics training: "
          f"{z['to_training_s']} s; fresh interpreter {f['to_training_s']} s)")
    print(f"GPU freed → next process started: p95 {fr['to_running_p95_s']} s (→ training p95 {fr['to_training_p95_s']} s)")
    if result.get("slurm"):
        s = result["slurm"]
        print(f"slurm: idle sbatch → script runs {s['idle_to_start_median_s']} s median; "
              f"freed → next script p95 {s['freed_to_start_p95_s']} s")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
