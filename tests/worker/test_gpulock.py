"""Node-local GPU locks: whole GPUs are exclusive, shares coexist, a dead holder frees them."""

from __future__ import annotations

import subprocess
import sys
import time

from worker.gpulock import GpuLocks


def test_a_whole_gpu_lock_excludes_everyone_else(tmp_path):
    first = GpuLocks(tmp_path, [0, 1], exclusive=True)
    assert first.try_acquire()
    assert not GpuLocks(tmp_path, [1], exclusive=True).try_acquire()
    assert not GpuLocks(tmp_path, [1], exclusive=False).try_acquire()
    assert GpuLocks(tmp_path, [2], exclusive=True).try_acquire()
    first.release()
    assert GpuLocks(tmp_path, [1], exclusive=True).try_acquire()


def test_fractional_jobs_share_a_gpu_but_keep_a_whole_gpu_job_out(tmp_path):
    a, b = GpuLocks(tmp_path, [0], exclusive=False), GpuLocks(tmp_path, [0], exclusive=False)
    assert a.try_acquire() and b.try_acquire()
    assert not GpuLocks(tmp_path, [0], exclusive=True).try_acquire()
    a.release()
    b.release()
    assert GpuLocks(tmp_path, [0], exclusive=True).try_acquire()


def test_it_takes_all_or_nothing(tmp_path):
    held = GpuLocks(tmp_path, [1], exclusive=True)
    assert held.try_acquire()
    wanted = GpuLocks(tmp_path, [0, 1], exclusive=True)
    assert not wanted.try_acquire()
    assert GpuLocks(tmp_path, [0], exclusive=True).try_acquire(), "GPU 0 must not stay locked by the failed try"


def test_a_killed_holder_releases_its_gpus(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; sys.path.insert(0, '.'); from pathlib import Path; from worker.gpulock import GpuLocks; "
        f"l = GpuLocks(Path({str(tmp_path)!r}), [0], exclusive=True); assert l.try_acquire(); "
        "print('held', flush=True); time.sleep(60)")], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    assert not GpuLocks(tmp_path, [0], exclusive=True).try_acquire()
    holder.kill()
    holder.wait()
    time.sleep(0.05)
    assert GpuLocks(tmp_path, [0], exclusive=True).try_acquire()
