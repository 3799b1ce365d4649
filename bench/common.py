"""Shared pieces of the benchmarks: a throwaway installation, statistics, Slurm.

:class:`Stack` is a whole yoloportal in a temporary folder: its own ``DATA_DIR``, a fresh
SQLite file or a fresh database on the local PostgreSQL (``scripts/postgres.sh``), its own
Redis, and the web/scheduler/worker processes a benchmark starts — all removed afterwards.
The benchmark process itself talks to it over HTTP and, where it reads timelines, through
the ORM (``Stack.django()``, once per process).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PYTHON = sys.executable
POSTGRES_SCRIPT = ROOT / "scripts" / "postgres.sh"


# --- statistics --------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100), as the submit recipe computes p95."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))]


def median(values: list[float]) -> float:
    return statistics.median(values)


def rounded(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


# --- processes ---------------------------------------------------------------------------------


def tree_cpu_s(*roots: int) -> float:
    """CPU seconds (user + system) used so far by the processes ``roots`` and all their
    descendants alive now (exited children of a live process count in its own figures only
    once reaped, so measure long-lived servers, not short-lived helpers)."""
    hz = os.sysconf("SC_CLK_TCK")
    table: dict[int, tuple[int, int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            table[int(entry)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    pids = {r for r in roots if r in table}
    grown = True
    while grown:
        children = {pid for pid, (parent, _) in table.items() if parent in pids} - pids
        pids |= children
        grown = bool(children)
    return sum(table[pid][1] for pid in pids) / hz


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, process: subprocess.Popen | None = None, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"process exited with {process.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on port {port} after {timeout:.0f} s")


def postgres_url() -> str | None:
    """The local throwaway PostgreSQL (started if needed; root only), or None."""
    if os.geteuid() != 0 or not POSTGRES_SCRIPT.exists():
        return None
    result = subprocess.run([str(POSTGRES_SCRIPT), "start"], capture_output=True, text=True, timeout=300)
    return result.stdout.strip().splitlines()[-1] if result.returncode == 0 else None


class Stack:
    """One throwaway installation. Use as a context manager."""

    def __init__(self, name: str, database: str = "sqlite") -> None:
        self.name = name
        self.database = database
        self.dir = Path(tempfile.mkdtemp(prefix=f"yp-bench-{name}-"))
        self.processes: dict[str, subprocess.Popen] = {}
        self.pg_admin_url = None
        if database == "postgres":
            base = postgres_url()
            if base is None:
                raise RuntimeError("PostgreSQL is not available (scripts/postgres.sh start needs root)")
            self.pg_admin_url = base
            self.db_name = f"bench_{name.replace('-', '_')}_{uuid.uuid4().hex[:6]}"
            self.psql(f"CREATE DATABASE {self.db_name}")
            database_url = base.rsplit("/", 1)[0] + "/" + self.db_name
        elif database == "sqlite":
            database_url = f"sqlite:///{self.dir / 'yoloportal.sqlite3'}"
        else:
            raise ValueError(f"unknown database {database!r}")
        from apps.core.redis_server import RedisServer

        self.redis = RedisServer(data_dir=self.dir / "redis").start()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "DJANGO_"))}
        self.env.update({
            "DATA_DIR": str(self.dir), "DATABASE_URL": database_url, "REDIS_URL": self.redis.url,
            "DJANGO_SETTINGS_MODULE": "yoloportal.settings", "LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1",
            "SECRET_KEY": "bench-" + uuid.uuid4().hex, "THROTTLE_SUBMIT": "1000000/min",
            "MAX_ACTIVE_JOBS_PER_USER": "1000000",
        })

    def psql(self, sql: str) -> None:
        subprocess.run(["psql", self.pg_admin_url, "-q", "-c", sql], check=True, capture_output=True, timeout=120)

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- setting up ------------------------------------------------------------------------

    def manage(self, *args: str, timeout: float = 600) -> str:
        result = subprocess.run([PYTHON, "manage.py", *args], cwd=ROOT, env=self.env, capture_output=True,
                                text=True, timeout=timeout)
        if result.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
        return result.stdout

    def prepare(self, *, node_gpus: int = 0) -> str:
        """Migrate, demo teams/users/dataset, optionally a registered node; returns alice's token."""
        self.manage("migrate", "--noinput")
        self.manage("demo_setup")
        if node_gpus:
            self.manage("shell", "-c", "from worker.node import register_this_host as node_register; "
                        "from worker.inventory import simulated_gpus; "
                        f"node_register(name='bench-node', gpus=simulated_gpus({node_gpus}))")
        return self.manage("issue_token", "alice").strip()

    def users(self, count: int, *, team: str) -> list[str]:
        """``count`` more members of ``team`` (bench-user-1 ...); returns their API tokens."""
        if count <= 0:
            return []
        out = self.manage("shell", "-c", (
            "from apps.accounts.models import Membership, Team\n"
            "from apps.accounts.services import membership_set, token_create, user_ensure\n"
            f"team = Team.objects.get(slug={team!r})\n"
            f"for n in range(1, {count + 1}):\n"
            "    user = user_ensure(username=f'bench-user-{n}', password='bench-' + str(n))\n"
            "    membership_set(user=user, team=team, role=Membership.Role.MEMBER)\n"
            "    print('token:', token_create(user=user, name='bench')[1])\n"))
        # The shell prints its own lines too ("N objects imported automatically").
        tokens = [line.split()[1] for line in out.splitlines() if line.startswith("token: ")]
        if len(tokens) != count:
            raise RuntimeError(f"expected {count} tokens, got:\n{out}")
        return tokens

    def django(self) -> None:
        """Point this process's Django at the stack (once per process)."""
        os.environ.update(self.env)
        import django

        django.setup()

    # --- processes -------------------------------------------------------------------------

    def start(self, name: str, argv: list[str], **env: str) -> subprocess.Popen:
        log = open(self.dir / f"{name}.log", "ab")
        process = subprocess.Popen(argv, cwd=ROOT, env={**self.env, **env}, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        self.processes[name] = process
        return process

    def start_web(self, *, server: str = "uvicorn", workers: int = 2) -> str:
        port = free_port()
        if server == "uvicorn":
            argv = [PYTHON, "-m", "uvicorn", "yoloportal.asgi:application", "--host", "127.0.0.1",
                    "--port", str(port), "--workers", str(workers), "--no-access-log"]
        elif server == "daphne":
            argv = [PYTHON, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "yoloportal.asgi:application"]
        else:
            raise ValueError(server)
        process = self.start("web", argv)
        wait_for_port(port, process)
        url = f"http://127.0.0.1:{port}"
        # Every worker process answers once before the clock starts (imports, first queries).
        for _ in range(4 * workers):
            http_get(url + "/accounts/login/")
        return url

    def start_scheduler(self, **env: str) -> subprocess.Popen:
        return self.start("scheduler", [PYTHON, "manage.py", "scheduler"], **env)

    def start_worker(self, *, gpus: int | None = 1, name: str = "bench-node", **env: str) -> subprocess.Popen:
        """A gpu_worker with ``gpus`` simulated GPUs; ``gpus=None``: the node's real (NVIDIA) GPUs."""
        simulate = [] if gpus is None else ["--simulate-gpus", str(gpus)]
        return self.start(f"worker-{name}", [PYTHON, "manage.py", "gpu_worker", "--name", name, *simulate], **env)

    def log(self, name: str) -> str:
        path = self.dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop_process(self, name: str) -> None:
        process = self.processes.pop(name)
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()

    def stop(self) -> None:
        for name in list(self.processes):
            self.stop_process(name)
        self.redis.stop()
        if self.pg_admin_url:
            # Connections of killed processes may linger a moment.
            self.psql(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{self.db_name}'")
            self.psql(f"DROP DATABASE IF EXISTS {self.db_name}")
        shutil.rmtree(self.dir, ignore_errors=True)


# --- HTTP --------------------------------------------------------------------------------------


def http_get(url: str, token: str | None = None, timeout: float = 30) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"Token {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def http_post_json(url: str, token: str, body: dict, timeout: float = 30) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={
        "Authorization": f"Token {token}", "Content-Type": "application/json", "Idempotency-Key": str(uuid.uuid4())})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {"error": exc.read().decode(errors="replace")[:500]}


# --- Slurm ---------------------------------------------------------------------------------------


class Slurm:
    """A private one-node Slurm for baselines, configured as ../shared/recipes/slurm-single-node.sh
    configures one (Debian slurm-wlm 22.05, 8 GRES GPUs on fake device files, cons_tres,
    multifactor priority + backfill, defaults otherwise) but on its own ports, state folders and
    ``SLURM_CONF``: another Slurm on this machine (a test's, /etc/slurm's) is left alone, and
    only this instance's jobs are ever cancelled. Needs root, munged and the slurm-wlm binaries
    (the recipe installs them); :meth:`available` says whether they are there.
    """

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="yp-bench-slurm-"))
        self.conf = self.dir / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.job_ids: list[str] = []

    @staticmethod
    def available() -> bool:
        return os.geteuid() == 0 and all(shutil.which(b) for b in ("sbatch", "slurmctld", "slurmd", "munged"))

    def __enter__(self) -> Slurm:
        host = socket.gethostname().split(".")[0]
        for sub in ("state", "spool", "log"):
            (self.dir / sub).mkdir()
        for i in range(8):
            (self.dir / f"fakegpu{i}").touch()
        ctld, slurmd = free_port(), free_port()
        self.conf.write_text(f"""ClusterName=ypbench
SlurmctldHost={host}
SlurmUser=root
SlurmctldPort={ctld}
SlurmdPort={slurmd}
AuthType=auth/munge
StateSaveLocation={self.dir}/state
SlurmdSpoolDir={self.dir}/spool
SlurmctldPidFile={self.dir}/slurmctld.pid
SlurmdPidFile={self.dir}/slurmd.pid
SlurmctldLogFile={self.dir}/log/slurmctld.log
SlurmdLogFile={self.dir}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
PriorityType=priority/multifactor
GresTypes=gpu
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
NodeName={host} CPUs={os.cpu_count()} RealMemory=2000 Gres=gpu:8 State=UNKNOWN
PartitionName=gpu Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
""")
        (self.dir / "gres.conf").write_text(f"NodeName={host} Name=gpu File={self.dir}/fakegpu[0-7]\n")
        if subprocess.run(["pgrep", "-x", "munged"], capture_output=True).returncode != 0:
            Path("/run/munge").mkdir(parents=True, exist_ok=True)
            shutil.chown("/run/munge", "munge", "munge")
            subprocess.run(["su", "-s", "/bin/sh", "munge", "-c", "/usr/sbin/munged"], check=True, timeout=30)
        # -i: ignore any saved state (there is none: a fresh folder).
        subprocess.run(["/usr/sbin/slurmctld", "-i", "-f", str(self.conf)], env=self.env, check=True, timeout=60)
        subprocess.run(["/usr/sbin/slurmd", "-f", str(self.conf)], env=self.env, check=True, timeout=60)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            out = subprocess.run(["sinfo", "-h", "-o", "%t"], env=self.env, capture_output=True, text=True).stdout
            if out.strip() in {"idle", "mix", "alloc"}:
                return self
            subprocess.run(["scontrol", "update", f"nodename={host}", "state=resume"], env=self.env,
                           capture_output=True)
            time.sleep(1)
        self.__exit__()
        raise RuntimeError(f"private Slurm did not come up: {self.dir}/log")

    def __exit__(self, *exc) -> None:
        self.cancel()
        for pid_file in ("slurmd.pid", "slurmctld.pid"):
            path = self.dir / pid_file
            try:
                os.kill(int(path.read_text().strip()), signal.SIGTERM)
            except (OSError, ValueError):
                pass
        time.sleep(1)
        shutil.rmtree(self.dir, ignore_errors=True)

    def pids(self) -> list[int]:
        out = []
        for pid_file in ("slurmctld.pid", "slurmd.pid"):
            try:
                out.append(int((self.dir / pid_file).read_text().strip()))
            except (OSError, ValueError):
                pass
        return out

    def sbatch(self, *args: str) -> subprocess.CompletedProcess:
        result = subprocess.run(["sbatch", "--parsable", *args], env=self.env, capture_output=True, text=True,
                                timeout=120)
        if result.returncode == 0:
            self.job_ids.append(result.stdout.strip().split(";")[0])
        return result

    def cancel(self) -> None:
        """Cancel this instance's jobs (only those) and wait until the queue is empty."""
        for start in range(0, len(self.job_ids), 500):
            subprocess.run(["scancel", *self.job_ids[start:start + 500]], env=self.env, capture_output=True,
                           timeout=120)
        self.job_ids.clear()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            out = subprocess.run(["squeue", "-h", "-o", "%i"], env=self.env, capture_output=True, text=True,
                                 timeout=30).stdout
            if not out.strip():
                return
            time.sleep(0.5)


def run_threads(count: int, target) -> float:
    """Run ``target(i)`` in ``count`` threads; returns the wall time."""
    threads = [threading.Thread(target=target, args=(i,)) for i in range(count)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - started


def machine() -> dict:
    """What the figures were measured on."""
    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    memory_gib = 0.0
    try:
        kib = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                       if line.startswith("MemTotal")))
        memory_gib = round(kib / 1024 / 1024, 1)
    except (OSError, StopIteration, ValueError):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": memory_gib, "kernel": os.uname().release,
            "python": sys.version.split()[0], "load_average": [round(x, 2) for x in os.getloadavg()]}
