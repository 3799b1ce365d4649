"""A real one-node Slurm for the tests (Debian slurm-wlm 22.05 + munge; .ci/run installs them).

Started by the test fixture as root, with its own config under /tmp/yoloportal-slurm
(``SLURM_CONF`` points every client there): slurmctld and slurmd on this host, fake GPU
device files in gres.conf (``SLURM_SIMULATED_GPUS``: training runs on CPU),
``select/cons_tres``, backfill, no accounting database; ``ReturnToService=1``, so a node a
test sets down stays down until it resumes it (with 2 it would come back at its next
registration). Stopped at the end of the session
if this session started it. After ../shared/recipes/slurm-single-node.sh.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/tmp/yoloportal-slurm")
PARTITION = "gpu"
GPUS = 4
CTLD_PORT, SLURMD_PORT = 16817, 16818


@dataclass
class SlurmCluster:
    conf: Path
    node: str  # Slurm's NodeName (this host's short name)
    partition: str
    started: list[Path]  # pid files of the daemons this session started, in start order

    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *command: str, check: bool = True) -> str:
        done = subprocess.run(list(command), capture_output=True, text=True, timeout=60,
                              env={**os.environ, **self.env()})
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)}: {done.stderr or done.stdout}")
        return done.stdout

    def jobs(self) -> dict[str, dict]:
        """squeue --json -t all: job id → the raw job (ended ones stay for MinJobAge)."""
        return {str(j["job_id"]): j for j in json.loads(self.run("squeue", "--json", "--states=all"))["jobs"]}

    def node_state(self) -> str:
        return self.run("sinfo", "-h", "-n", self.node, "-o", "%T").strip()

    def resume(self) -> None:
        """Back to idle (after a test set the node down), with no job left running."""
        self.run("scancel", "--user=root", check=False)
        for name in self.run("scontrol", "show", "reservation", check=False).split():
            if name.startswith("ReservationName="):
                self.run("scontrol", "delete", f"reservationname={name.split('=', 1)[1]}", check=False)
        if self.node_state().rstrip("*~#") not in ("idle", "mixed", "allocated", "completing"):
            self.run("scontrol", "update", f"nodename={self.node}", "state=resume", check=False)
        wait(lambda: self.node_state().rstrip("*~#").startswith("idle"), 120, "the Slurm node to be idle")

    def stop(self) -> None:
        for pid_file in reversed(self.started):  # slurmd, slurmctld, then munged
            try:
                os.kill(int(pid_file.read_text()), signal.SIGTERM)
            except (OSError, ValueError):
                pass


def wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except (RuntimeError, OSError, subprocess.SubprocessError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")


def _alive(pid_file: Path) -> bool:
    try:
        os.kill(int(pid_file.read_text()), 0)
    except (OSError, ValueError):
        return False
    return True


def start_slurm() -> SlurmCluster | None:
    """A running one-node cluster (reused if this config's daemons already run); None without Slurm."""
    if os.geteuid() != 0 or not all(shutil.which(b) for b in ("slurmctld", "slurmd", "munged", "sbatch")):
        return None
    node = socket.gethostname().split(".")[0]
    for sub in ("state", "spool", "log"):
        (ROOT / sub).mkdir(parents=True, exist_ok=True)
    for i in range(GPUS):
        (ROOT / f"fakegpu{i}").touch()
    memory_mb = min(16000, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20 * 3 // 4)
    conf = ROOT / "slurm.conf"
    conf.write_text(f"""\
ClusterName=yoloportal-test
SlurmctldHost={node}
SlurmUser=root
SlurmctldPort={CTLD_PORT}
SlurmdPort={SLURMD_PORT}
AuthType=auth/munge
StateSaveLocation={ROOT}/state
SlurmdSpoolDir={ROOT}/spool
SlurmctldPidFile={ROOT}/slurmctld.pid
SlurmdPidFile={ROOT}/slurmd.pid
SlurmctldLogFile={ROOT}/log/slurmctld.log
SlurmdLogFile={ROOT}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
PriorityType=priority/multifactor
GresTypes=gpu
MpiDefault=none
ReturnToService=1
JobAcctGatherType=jobacct_gather/none
KillWait=5
NodeName={node} CPUs={os.cpu_count()} RealMemory={memory_mb} Gres=gpu:{GPUS} State=UNKNOWN
PartitionName={PARTITION} Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
""")
    (ROOT / "gres.conf").write_text(f"NodeName={node} Name=gpu File={ROOT}/fakegpu[0-{GPUS - 1}]\n")
    env = {**os.environ, "SLURM_CONF": str(conf)}
    started = []
    if subprocess.run(["pgrep", "-x", "munged"], capture_output=True).returncode != 0:
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        shutil.chown("/run/munge", "munge", "munge")
        subprocess.run(["su", "-s", "/bin/sh", "munge", "-c", "/usr/sbin/munged"], check=True)
        started.append(Path("/run/munge/munged.pid"))  # Debian's default; stopped last
    for daemon, pid_file in (("slurmctld", ROOT / "slurmctld.pid"), ("slurmd", ROOT / "slurmd.pid")):
        if not _alive(pid_file):
            subprocess.run([f"/usr/sbin/{daemon}", "-f", str(conf)], check=True, env=env)
            started.append(pid_file)
            wait(lambda p=pid_file: _alive(p), 30, f"{daemon} to start")
            time.sleep(1)
    cluster = SlurmCluster(conf=conf, node=node, partition=PARTITION, started=started)
    wait(lambda: cluster.node_state() != "", 30, "sinfo to answer")
    cluster.resume()
    return cluster
