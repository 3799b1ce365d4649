"""The container executor's command line, checked exactly (no runtime works on these machines:
podman's crun refuses hybrid cgroups and docker has no daemon; it is unproven against a real one)."""

from __future__ import annotations

import json
from pathlib import Path

from worker.executors.base import AttemptSpec
from worker.executors.cgroups import Limits
from worker.executors.container import ContainerExecutor, run_command

SHIM = Path(__file__).with_name("container_shim.py")
BASE = Path("/srv/yoloportal")


def spec(**overrides) -> AttemptSpec:
    values = dict(
        key="3f2a-1", config_path=Path("/data/jobs/j1/attempt-1/config-1.json"),
        events_path=Path("/data/jobs/j1/attempt-1/events-1.jsonl"), log_path=Path("/data/jobs/j1/attempt-1/output.log"),
        env={"PATH": "/host/bin", "HOME": "/root", "LANG": "C.UTF-8", "YOLO_OFFLINE": "1",
             "CUDA_VISIBLE_DEVICES": "1,3", "YOLOPORTAL_GPU_MEMORY_FRACTION": "0.5"},
        cwd=BASE, limits=Limits(memory_bytes=4 * 2**30, cpus=2.0, pids=4096), gpu_indices=(1, 3),
        image="ultralytics/yolov8:latest",
        read_only=(Path("/data/datasets/vision/pcb"), Path("/data/weights"), BASE / "worker", BASE / "apps" / "core"),
        writable=(Path("/data/jobs/j1"),),
    )
    values.update(overrides)
    return AttemptSpec(**values)


def test_the_run_command_carries_gpus_limits_mounts_and_the_child():
    assert run_command("podman", spec(), base_dir=BASE) == [
        "podman", "run", "--name", "yp-3f2a-1", "--init", "--network", "none", "--workdir", "/opt/yoloportal",
        "--gpus", "device=1,3",
        "--memory", "4294967296b", "--memory-swap", "4294967296b", "--cpus", "2", "--pids-limit", "4096",
        "--volume", "/data/jobs/j1:/data/jobs/j1:rw",
        "--volume", "/data/datasets/vision/pcb:/data/datasets/vision/pcb:ro",
        "--volume", "/data/weights:/data/weights:ro",
        "--volume", "/srv/yoloportal/worker:/opt/yoloportal/worker:ro",
        "--volume", "/srv/yoloportal/apps/__init__.py:/opt/yoloportal/apps/__init__.py:ro",
        "--volume", "/srv/yoloportal/apps/core:/opt/yoloportal/apps/core:ro",
        "--env", "CUDA_VISIBLE_DEVICES=1,3", "--env", "LANG=C.UTF-8", "--env", "PYTHONPATH=/opt/yoloportal",
        "--env", "YOLOPORTAL_GPU_MEMORY_FRACTION=0.5", "--env", "YOLO_OFFLINE=1",
        "ultralytics/yolov8:latest", "python", "-m", "worker.train_child", "/data/jobs/j1/attempt-1/config-1.json",
    ]


def test_a_cpu_job_without_limits_gets_no_gpu_or_limit_flags():
    command = run_command("docker", spec(gpu_indices=(), limits=Limits(pids=None)), base_dir=BASE)
    assert command[:2] == ["docker", "run"]
    assert not {"--gpus", "--memory", "--cpus", "--pids-limit"} & set(command)


def test_the_workers_data_folder_is_never_mounted():
    """Secrets and the database live there; only the job's folder and read-only inputs go in."""
    command = run_command("podman", spec(), base_dir=BASE)
    volumes = [command[i + 1] for i, word in enumerate(command) if word == "--volume"]
    assert len(volumes) == 6 and all(v.split(":")[0].startswith(("/data/jobs/j1", "/data/datasets", "/data/weights", "/srv/yoloportal/"))
               for v in volumes)


def test_a_job_without_an_image_runs_in_the_nodes_default_image(tmp_path, monkeypatch):
    log = tmp_path / "shim.jsonl"
    monkeypatch.setenv("CONTAINER_SHIM_LOG", str(log))
    config = tmp_path / "config.json"
    config.write_text("{}")
    executor = ContainerExecutor(runtime=str(SHIM), base_dir=Path(__file__).resolve().parents[2],
                                 default_image="team/default:1")
    execution = executor.start(spec(image="", config_path=config, log_path=tmp_path / "out.log",
                                    events_path=tmp_path / "events.jsonl", writable=(tmp_path,), read_only=()))
    while execution.poll() is None:
        pass
    assert execution.poll() == 2  # the child refused the empty config: it ran, through the shim
    assert execution.usage().oom_kills == 0
    execution.close()
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert calls[0][0] == "run" and "team/default:1" in calls[0]
    assert [c[0] for c in calls[1:]] == ["inspect", "rm"]
