"""Per-attempt cgroups against the real kernel: limits written, OOM kills counted, CPU capped.

These machines (and CI) run as root with a writable cgroup v1 hierarchy; under ``CI=true``
a host without writable cgroups is a failure, elsewhere those tests are skipped.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from worker.executors import cgroups
from worker.executors.cgroups import Limits, parse_mountinfo, parse_proc_cgroup, probe

V1_SPLIT = """\
12:pids:/
4:memory:/process_api/abc
2:cpuacct:/
1:cpu:/
0::/
"""
MOUNTS_V1_SPLIT = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""


def test_it_reads_v1_controllers_and_the_v2_path_from_proc_cgroup():
    v1, v2 = parse_proc_cgroup(V1_SPLIT + "9:name=systemd:/x\n3:cpu,cpuacct:/both\n")
    assert v1 == {"pids": "/", "memory": "/process_api/abc", "cpuacct": "/both", "cpu": "/both"}
    assert v2 == "/"


def test_it_reads_cgroup_mounts_and_their_options_from_mountinfo():
    mounts = parse_mountinfo(MOUNTS_V1_SPLIT)
    assert [(str(m.point), m.fstype) for m in mounts][:2] == [("/sys/fs/cgroup/cpu", "cgroup"),
                                                             ("/sys/fs/cgroup/cpuacct", "cgroup")]
    assert "memory" in mounts[2].options and mounts[-1].fstype == "cgroup2"


def test_a_namespaced_mount_maps_our_path_below_its_root():
    """In a container the mount shows /kubepods/pod1 at /sys/fs/cgroup: our /kubepods/pod1/c is ./c."""
    mount = parse_mountinfo("50 1 0:40 /kubepods/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n")[0]
    assert cgroups._inside(mount, "/kubepods/pod1/c") == Path("/sys/fs/cgroup/c")
    assert cgroups._inside(mount, "/elsewhere") is None


def test_a_host_without_cgroups_says_limits_are_not_enforced():
    host = probe(proc_cgroup="", mountinfo="")
    assert host.enforced == ()
    assert host.describe().startswith("limits not enforced (no cgroup hierarchy")


def test_limits_follow_the_request_and_never_exceed_the_machine():
    limits = Limits.for_request(memory_mb=4096, cpu_milli=64000, host_cpus=2)
    assert limits.memory_bytes == 4 * 2**30 and limits.cpus == 2.0
    assert Limits.for_request(memory_mb=0, cpu_milli=0).memory_bytes is None
    assert Limits.for_request(memory_mb=0, cpu_milli=0).cpus is None


def test_the_oom_message_units_read_like_the_request():
    assert cgroups.human_bytes(4 * 2**30) == "4.0 GiB" and cgroups.limit_text(4 * 2**30) == "4 GiB"
    assert cgroups.human_bytes(64 * 2**20) == "64.0 MiB" and cgroups.limit_text(1536 * 2**20) == "1.5 GiB"


def test_a_childs_error_is_labelled_by_its_kind_and_else_by_what_the_job_was_doing():
    """A local and a Slurm attempt share one label table (they had two, which disagreed on an
    out-of-memory without the CUDA flag); an unclassified failure of an export was called a
    "training error"."""
    from worker.executors.base import error_lines

    failed = {"kind": "exception", "message": "FP16 export needs a GPU", "advice": "Unexpected failure."}
    assert error_lines(failed, "export") == ["export error: FP16 export needs a GPU", "Advice: Unexpected failure."]
    assert error_lines(failed, "train")[0] == "training error: FP16 export needs a GPU"
    assert error_lines(failed, "val")[0].startswith("validation error: ")
    assert error_lines({"kind": "oom", "message": "m"}, "train") == ["out of memory: m"]
    assert error_lines({"kind": "oom", "cuda": True, "message": "m"}, "train") == ["CUDA out of memory: m"]
    assert error_lines({"kind": "data", "message": "m"}, "predict") == ["dataset problem: m"]


# --- the real kernel ----------------------------------------------------------------------------


@pytest.fixture
def host():
    found = probe()
    if set(found.enforced) != {"memory", "cpu", "pids"}:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run where cgroups are writable: {found.describe()}")
        pytest.skip(found.describe())
    return found


@pytest.fixture
def make_group(host):
    made = []

    def make(limits: Limits):
        group = host.create(cgroups.attempt_name(f"test-{len(made)}"), limits)
        made.append(group)
        return group

    yield make
    for group in made:
        group.remove()


def run_in(group, code: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], preexec_fn=lambda: cgroups.join(group.procs_files),
                            **kwargs)


def test_the_host_probe_finds_memory_cpu_and_pids_here(host):
    assert host.version in ("v1", "v2")
    assert "limits enforced" in host.describe() and "not enforced" not in host.describe()


def test_a_process_over_its_memory_limit_is_killed_and_only_it(make_group):
    """The OOM killer acts inside the cgroup: the neighbour with room keeps running."""
    small = make_group(Limits(memory_bytes=64 * 2**20))
    roomy = make_group(Limits(memory_bytes=512 * 2**20))
    neighbour = run_in(roomy, "import time; a = bytearray(100 << 20); time.sleep(3); print('alive')",
                       stdout=subprocess.PIPE, text=True)
    greedy = run_in(small, "a = bytearray(300 << 20)")
    assert greedy.wait(60) == -9
    usage = small.usage()
    assert usage.oom_kills == 1
    assert usage.memory_limit_bytes == 64 * 2**20
    assert 60 * 2**20 <= usage.memory_peak_bytes <= 64 * 2**20
    out, _ = neighbour.communicate(timeout=60)
    assert neighbour.returncode == 0 and out.strip() == "alive"
    assert roomy.usage().oom_kills == 0


def test_cpu_time_stays_within_the_quota(make_group):
    """Two busy threads under a 0.5 CPU quota get at most 0.5 CPU-seconds per second (+10%)."""
    group = make_group(Limits(cpus=0.5))
    busy = ("import threading, time\n"
            "end = time.monotonic() + 3\n"
            "def spin():\n"
            "    while time.monotonic() < end: pass\n"
            "threads = [threading.Thread(target=spin) for _ in range(2)]\n"
            "[t.start() for t in threads]; [t.join() for t in threads]\n")
    started = time.monotonic()
    assert run_in(group, busy).wait(60) == 0
    wall = time.monotonic() - started
    used = group.usage().cpu_seconds
    assert used is not None and used > 0.1
    assert used <= 0.5 * wall * 1.1, f"{used:.2f} CPU-s in {wall:.2f} s under a 0.5 CPU quota"


def test_the_pids_limit_stops_a_process_storm(make_group):
    group = make_group(Limits(pids=8))
    storm = ("import threading, time\n"
             "made = 0\n"
             "try:\n"
             "    for _ in range(64):\n"
             "        threading.Thread(target=time.sleep, args=(2,), daemon=True).start(); made += 1\n"
             "except RuntimeError:\n"
             "    print(made)\n")
    process = run_in(group, storm, stdout=subprocess.PIPE, text=True)
    out, _ = process.communicate(timeout=60)
    assert out.strip() and int(out) < 8


def test_remove_kills_what_is_left_and_deletes_the_cgroup(make_group):
    group = make_group(Limits(memory_bytes=256 * 2**20))
    straggler = run_in(group, "import time; time.sleep(60)", start_new_session=True)
    time.sleep(0.2)
    assert group.pids() == [straggler.pid]
    assert group.remove(wait_s=10)
    assert straggler.wait(10) == -9
    assert not any(folder.exists() for folder in group.folders.values())


def test_sweep_removes_only_cgroups_of_dead_creators(host):
    dead = subprocess.Popen(["true"])
    dead.wait()
    orphan = {c: own / f"yp-{dead.pid}-orphan" for c, own in host.own.items()}
    for folder in orphan.values():
        folder.mkdir(exist_ok=True)
    mine = host.create(cgroups.attempt_name("live"), Limits())
    try:
        assert host.sweep() >= 1
        assert not any(f.exists() for f in orphan.values())
        assert all(f.exists() for f in mine.folders.values())
    finally:
        mine.remove()
