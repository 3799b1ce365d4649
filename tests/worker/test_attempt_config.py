"""What the worker gives the training child to keep it in its lane (issue 12): dataloader
workers and torch threads capped to the CPUs asked for, a fractional GPU's share of memory,
the cgroup limits from the request."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from django.conf import settings

from apps.jobs.models import Job
from tests.jobs.factories import make_job
from worker.tasks import AttemptRunner, child_config, child_env

pytestmark = pytest.mark.django_db

RESOLVED = {"model": "yolov8n.yaml", "data_yaml": "/data/demo/data.yaml"}


def job_with(teams, alice, node, *, train_args=None, **fields) -> Job:
    job = make_job(team=teams["vision"], user=alice, node=node, gpu_indices=[1], state="running", **fields)
    spec = {**job.spec, "resolved": RESOLVED}
    spec["train_args"].update(train_args or {})
    Job.objects.filter(pk=job.pk).update(spec=spec)
    return Job.objects.select_related("node").get(pk=job.pk)


def config_of(job: Job) -> dict:
    return child_config(job, resume_from=None, events_path=job.run_dir / "events.jsonl")


def test_a_job_asking_two_cpus_gets_two_threads_and_at_most_two_dataloader_workers(teams, alice, node):
    job = job_with(teams, alice, node, cpu_milli=2000, train_args={"workers": 6})
    config = config_of(job)
    assert config["cpu_threads"] == 2 and config["args"]["workers"] == 2
    env = child_env(job)
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "2"


def test_ultralytics_default_of_eight_workers_is_capped_too(teams, alice, node):
    job = job_with(teams, alice, node, cpu_milli=3000)
    job.node.simulated = False
    assert config_of(job)["args"]["workers"] == 3


def test_a_job_that_asked_no_cpus_keeps_torch_defaults(teams, alice, node):
    job = job_with(teams, alice, node)
    assert config_of(job)["cpu_threads"] is None
    assert child_env(job).get("OMP_NUM_THREADS") == os.environ.get("OMP_NUM_THREADS")


def test_a_fractional_job_is_told_its_share_of_gpu_memory(teams, alice, node):
    """In the child's arguments (config) and its environment."""
    job = job_with(teams, alice, node, gpus=0.25, gpu_share=0.25)
    assert config_of(job)["gpu_memory_fraction"] == 0.25
    assert child_env(job)["YOLOPORTAL_GPU_MEMORY_FRACTION"] == "0.25"


def test_a_whole_gpu_job_gets_no_fraction(teams, alice, node):
    job = job_with(teams, alice, node)
    assert config_of(job)["gpu_memory_fraction"] is None
    assert "YOLOPORTAL_GPU_MEMORY_FRACTION" not in child_env(job)


def test_the_cgroup_limits_come_from_the_request(teams, alice, node):
    job = job_with(teams, alice, node, cpu_milli=64000, memory_mb=4096)
    runner = AttemptRunner(job)
    spec = runner.attempt_spec(1, runner.child_config(1, None))
    assert spec.limits.memory_bytes == 4 * 2**30
    assert spec.limits.cpus == float(os.cpu_count())  # never more than the machine has
    assert spec.limits.pids == 4096


def test_auto_batch_sizes_against_the_share():
    """Ultralytics' fraction of available memory shrinks so the batch fits a quarter of the GPU."""
    from worker.train_child import share_fraction

    # 80 GiB GPU, 78 available; batch=-1 (0.6): a quarter share leaves 20 GiB, so 0.6 × 20 / 78.
    assert share_fraction(0.6, share=0.25, total_gib=80, available_gib=78) == pytest.approx(0.6 * 20 / 78)
    # Less available than the share: the whole of what is available is ours.
    assert share_fraction(0.6, share=0.5, total_gib=80, available_gib=10) == pytest.approx(0.6)


@pytest.mark.django_db(False)
def test_the_child_applies_its_threads_and_its_gpu_share(tmp_path):
    """The child's own side (worker/train_child.py: apply_limits), in a fresh interpreter since it
    changes process state: torch runs as many threads as CPUs asked for, and the auto-batch
    that Ultralytics' trainer calls (check_train_batch_size → autobatch) sizes against the share.
    (set_per_process_memory_fraction itself needs a GPU: scripts/gpu_check.sh.)"""
    code = textwrap.dedent(f"""
        from pathlib import Path
        import torch
        from ultralytics.utils.autobatch import check_train_batch_size
        from worker.train_child import ChildConfig, apply_limits
        p = Path({str(tmp_path)!r})
        before = torch.get_num_threads()
        apply_limits(ChildConfig(model="yolov8n.yaml", data=None, args={{}}, device="cpu", project=p, name="train",
                                 resume_from=None, checkpoint_dir=p, events_path=p / "events.jsonl", config_dir=p,
                                 cpu_threads=1, gpu_memory_fraction=0.25))
        print(before, torch.get_num_threads(), check_train_batch_size.__globals__["autobatch"]._yoloportal_share)
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=settings.BASE_DIR, capture_output=True, text=True,
                          timeout=180, env={**os.environ, "YOLO_CONFIG_DIR": str(tmp_path), "OMP_NUM_THREADS": "2"})
    assert done.returncode == 0, done.stderr
    before, threads, share = done.stdout.split()[-3:]
    assert (before, threads, share) == ("2", "1", "0.25")
