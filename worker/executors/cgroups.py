"""Per-attempt cgroups: one training process tree, its memory, CPU and process limits.

Each attempt gets its own cgroup *under the worker's own one* (read from
``/proc/self/cgroup``): under systemd that is the unit's cgroup (``Delegate=yes``), on
these machines and in CI a nested one the worker already sits in. Never Django, never
torch: the zygote's child and the Slurm relay import this too.

- **v2** (one ``cgroup2`` hierarchy, controllers listed in its ``cgroup.controllers``):
  ``memory.max`` (+ ``memory.swap.max`` 0), ``cpu.max`` "quota period", ``pids.max``;
  peak in ``memory.peak``, OOM kills in ``memory.events`` (``oom_kill N``), CPU time in
  ``cpu.stat`` (``usage_usec``). A v2 cgroup that holds processes cannot hand controllers
  to its children ("no internal processes"), so the worker first moves itself into a
  ``supervisor`` leaf beside the attempts, as systemd's delegation expects.
- **v1** (one hierarchy per controller; this machine and CI, where ``cpu`` and
  ``cpuacct`` may be mounted apart): ``memory.limit_in_bytes`` (+ ``memsw`` when swap
  accounting exists), ``cpu.cfs_quota_us``/``cpu.cfs_period_us``, ``pids.max``; peak in
  ``memory.max_usage_in_bytes``, OOM kills in ``memory.oom_control``, CPU time in
  ``cpuacct.usage`` (ns).

Memory charged before a process joins stays where it was: a child forked from the
preloaded zygote does not pay for the interpreter pages it shares with the zygote (they
stay the zygote's, i.e. the worker's), only for what it touches afterwards. So a child
joins its cgroup first thing after the fork, before it allocates anything.

Where neither version is writable the host reports "limits not enforced" and attempts
run without a cgroup (:func:`probe` says which controllers work and why not).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

CONTROLLERS = ("memory", "cpu", "pids")  # the limits; "cpuacct" (v1) only measures
CFS_PERIOD_US = 100_000
DEFAULT_PIDS_MAX = 4096
PREFIX = "yp-"  # every cgroup we create is named yp-<something>
SUPERVISOR = "yp-supervisor"  # v2 only: where the worker's own processes go


@dataclass(frozen=True)
class Limits:
    """What one attempt may use. None = no limit on that resource."""

    memory_bytes: int | None = None
    cpus: float | None = None
    pids: int | None = DEFAULT_PIDS_MAX

    @classmethod
    def for_request(cls, *, memory_mb: int, cpu_milli: int, pids: int | None = DEFAULT_PIDS_MAX,
                    host_cpus: int | None = None) -> Limits:
        """Limits from a job's request: memory = the memory asked for, CPU quota = the CPUs
        asked for but never more than the machine has; 0 (not asked) = no limit."""
        host = host_cpus or os.cpu_count() or 1
        cpus = min(cpu_milli / 1000, float(host)) if cpu_milli else None
        return cls(memory_bytes=memory_mb * 2**20 if memory_mb else None, cpus=cpus, pids=pids)


@dataclass
class Usage:
    """What an attempt's cgroup measured (None where the controller is not in use)."""

    memory_peak_bytes: int | None = None
    memory_limit_bytes: int | None = None
    oom_kills: int = 0
    cpu_seconds: float | None = None

    def as_dict(self) -> dict:
        return {"memory_peak_bytes": self.memory_peak_bytes, "memory_limit_bytes": self.memory_limit_bytes,
                "oom_kills": self.oom_kills, "cpu_seconds": self.cpu_seconds}


# --------------------------------------------------------------------------- discovery


def parse_proc_cgroup(text: str) -> tuple[dict[str, str], str | None]:
    """``/proc/<pid>/cgroup`` → ({v1 controller: path}, v2 path or None)."""
    v1: dict[str, str] = {}
    v2: str | None = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            v2 = path
            continue
        for controller in controllers.split(","):
            if controller and not controller.startswith("name="):
                v1[controller] = path
    return v1, v2


@dataclass(frozen=True)
class Mount:
    root: str  # the cgroup path this mount shows at its mount point ("/" unless namespaced)
    point: Path
    fstype: str
    options: frozenset[str]


def parse_mountinfo(text: str) -> list[Mount]:
    """cgroup and cgroup2 mounts from ``/proc/self/mountinfo``."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        point = fields[4].replace("\\040", " ")
        mounts.append(Mount(root=fields[3], point=Path(point), fstype=tail[0],
                            options=frozenset(tail[2].split(","))))
    return mounts


def _inside(mount: Mount, path: str) -> Path | None:
    """The directory of cgroup ``path`` under ``mount``, if the mount shows it."""
    root = mount.root.rstrip("/")
    if root and not (path == root or path.startswith(root + "/")):
        return None
    relative = path[len(root):].lstrip("/")
    return mount.point / relative if relative else mount.point


@dataclass
class Host:
    """The cgroups this process may create attempts under: controller → its own cgroup folder."""

    version: str = ""  # "v2", "v1" or "" (none writable)
    own: dict[str, Path] = field(default_factory=dict)  # memory/cpu/pids (+ cpuacct on v1) → folder
    problems: list[str] = field(default_factory=list)

    @property
    def enforced(self) -> tuple[str, ...]:
        return tuple(c for c in CONTROLLERS if c in self.own)

    def describe(self) -> str:
        """One line for the node's registration and the cluster view."""
        if not self.enforced:
            why = "; ".join(self.problems) or "no writable cgroup hierarchy"
            return f"limits not enforced ({why})"
        missing = [c for c in CONTROLLERS if c not in self.own]
        text = f"cgroup {self.version}: {', '.join(self.enforced)} limits enforced"
        return text + (f"; not enforced: {', '.join(missing)}" if missing else "")

    def as_dict(self) -> dict:
        return {"version": self.version, "enforced": list(self.enforced), "summary": self.describe()}

    def create(self, name: str, limits: Limits) -> AttemptCgroup:
        """Make ``<own>/yp-<name>`` in each usable controller and write ``limits`` there."""
        if not self.enforced:
            raise OSError(errno.ENOTSUP, self.describe())
        folders: dict[str, Path] = {}
        group = AttemptCgroup(version=self.version, folders=folders)
        try:
            for controller, own in self.own.items():
                folder = own / f"{PREFIX}{name}"
                if folder in folders.values():  # v2: one folder for every controller
                    folders[controller] = folder
                    continue
                with contextlib.suppress(FileExistsError):
                    folder.mkdir()
                folders[controller] = folder
            group.apply(limits)
        except OSError:
            group.remove()
            raise
        return group

    def sweep(self) -> int:
        """Remove empty attempt cgroups whose creator is dead (a killed worker's); returns how many.

        Names carry the creating process's pid (:func:`attempt_name`), so a sweep never takes
        the cgroup of a live attempt of another worker on the same host (v1 ``cpu`` is often
        shared by every process on the machine).
        """
        removed = 0
        for own in set(self.own.values()):
            for folder in own.glob(f"{PREFIX}*"):
                match = re.fullmatch(rf"{PREFIX}(\d+)-.+", folder.name)
                if not match or _alive(int(match.group(1))):
                    continue
                with contextlib.suppress(OSError):  # not empty: leave it to its processes
                    folder.rmdir()
                    removed += 1
        return removed


def probe(*, proc_cgroup: str | None = None, mountinfo: str | None = None) -> Host:
    """Find where this process may create attempt cgroups, and check it really can.

    1. Read our own cgroup(s) from ``/proc/self/cgroup`` and the mounts from mountinfo.
    2. Prefer v2 when the unified hierarchy offers memory, cpu and pids to our cgroup's
       children (moving ourselves into a leaf first if needed); else v1 per controller.
    3. For each controller, create and remove a throwaway ``yp-probe-<pid>`` child with a
       limit written: a controller counts as enforced only if that worked.
    """
    proc_cgroup = Path("/proc/self/cgroup").read_text() if proc_cgroup is None else proc_cgroup
    mountinfo = Path("/proc/self/mountinfo").read_text() if mountinfo is None else mountinfo
    v1_paths, v2_path = parse_proc_cgroup(proc_cgroup)
    mounts = parse_mountinfo(mountinfo)
    host = Host()
    problems: list[str] = []

    unified = next((m for m in mounts if m.fstype == "cgroup2"), None)
    if unified is not None and v2_path is not None:
        own = _inside(unified, v2_path)
        if own is not None:
            available = set(_read(own / "cgroup.controllers").split())
            if set(CONTROLLERS) <= available:
                v2 = _probe_v2(own, problems)
                if v2 is not None:
                    host.version, host.own = "v2", v2
                    return host
            elif not v1_paths:
                problems.append(f"cgroup v2 at {own} offers only {' '.join(sorted(available)) or 'no controllers'}")

    own_v1: dict[str, Path] = {}
    for controller in (*CONTROLLERS, "cpuacct"):
        if controller not in v1_paths:
            continue
        mount = next((m for m in mounts if m.fstype == "cgroup" and controller in m.options), None)
        folder = _inside(mount, v1_paths[controller]) if mount else None
        if folder is None:
            problems.append(f"cgroup v1 {controller}: our cgroup {v1_paths[controller]} is not mounted here")
            continue
        if _probe_v1(controller, folder, problems):
            own_v1[controller] = folder
    if any(c in own_v1 for c in CONTROLLERS):
        host.version, host.own = "v1", own_v1
    elif not v1_paths and v2_path is None:
        problems.append("no cgroup hierarchy in /proc/self/cgroup")
    host.problems = problems
    return host


def _probe_v1(controller: str, folder: Path, problems: list[str]) -> bool:
    test = folder / f"{PREFIX}probe-{os.getpid()}"
    limit_file = {"memory": "memory.limit_in_bytes", "cpu": "cpu.cfs_quota_us", "pids": "pids.max",
                  "cpuacct": None}[controller]
    try:
        test.mkdir(exist_ok=True)
        try:
            if limit_file:
                _write(test / limit_file, {"memory": str(2**40), "cpu": "-1", "pids": "max"}[controller])
        finally:
            test.rmdir()
    except OSError as exc:
        problems.append(f"cgroup v1 {controller} at {folder}: {exc.strerror or exc}")
        return False
    return True


def _probe_v2(own: Path, problems: list[str]) -> dict[str, Path] | None:
    wanted = set(CONTROLLERS)
    try:
        if not wanted <= set(_read(own / "cgroup.subtree_control").split()):
            try:
                _enable_v2(own, wanted)
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    raise
                # "No internal processes": our cgroup holds the worker itself. Move every
                # process of it into a leaf beside the attempts, then hand out controllers.
                supervisor = own / SUPERVISOR
                supervisor.mkdir(exist_ok=True)
                for pid in _read(own / "cgroup.procs").split():
                    with contextlib.suppress(ProcessLookupError, OSError):
                        _write(supervisor / "cgroup.procs", pid)
                _enable_v2(own, wanted)
        test = own / f"{PREFIX}probe-{os.getpid()}"
        test.mkdir(exist_ok=True)
        try:
            _write(test / "memory.max", "max")
            _write(test / "cpu.max", f"max {CFS_PERIOD_US}")
            _write(test / "pids.max", "max")
        finally:
            test.rmdir()
    except OSError as exc:
        problems.append(f"cgroup v2 at {own}: {exc.strerror or exc}")
        return None
    return dict.fromkeys(CONTROLLERS, own)


def _enable_v2(own: Path, controllers: Iterable[str]) -> None:
    _write(own / "cgroup.subtree_control", " ".join(f"+{c}" for c in sorted(controllers)))


# --------------------------------------------------------------------------- one attempt


@dataclass
class AttemptCgroup:
    version: str
    folders: dict[str, Path]  # controller → this attempt's folder (v2: the same folder for all)

    @property
    def procs_files(self) -> list[str]:
        """Where to write a pid to put it in this cgroup (every hierarchy once)."""
        return sorted({str(folder / "cgroup.procs") for folder in self.folders.values()})

    def apply(self, limits: Limits) -> None:
        if self.version == "v2":
            folder = next(iter(self.folders.values()))
            _write(folder / "memory.max", str(limits.memory_bytes) if limits.memory_bytes else "max")
            with contextlib.suppress(FileNotFoundError):  # no swap accounting on this kernel
                _write(folder / "memory.swap.max", "0" if limits.memory_bytes else "max")
            quota = f"{int(limits.cpus * CFS_PERIOD_US)}" if limits.cpus else "max"
            _write(folder / "cpu.max", f"{quota} {CFS_PERIOD_US}")
            _write(folder / "pids.max", str(limits.pids) if limits.pids else "max")
            return
        if "memory" in self.folders:
            folder = self.folders["memory"]
            value = str(limits.memory_bytes) if limits.memory_bytes else "-1"
            _write(folder / "memory.limit_in_bytes", value)
            # With swap accounting, memory+swap gets the same limit: swapping is no way around it.
            with contextlib.suppress(FileNotFoundError):
                _write(folder / "memory.memsw.limit_in_bytes", value)
        if "cpu" in self.folders:
            folder = self.folders["cpu"]
            _write(folder / "cpu.cfs_period_us", str(CFS_PERIOD_US))
            _write(folder / "cpu.cfs_quota_us", str(int(limits.cpus * CFS_PERIOD_US)) if limits.cpus else "-1")
        if "pids" in self.folders:
            _write(self.folders["pids"] / "pids.max", str(limits.pids) if limits.pids else "max")

    def add(self, pid: int) -> None:
        """Move ``pid`` (and, on v1 ``cgroup.procs``, all its threads) into this cgroup."""
        for path in self.procs_files:
            _write(Path(path), str(pid))

    def pids(self) -> list[int]:
        found: set[int] = set()
        for path in self.procs_files:
            with contextlib.suppress(OSError):
                found.update(int(p) for p in Path(path).read_text().split())
        return sorted(found)

    def usage(self) -> Usage:
        usage = Usage()
        if self.version == "v2":
            folder = next(iter(self.folders.values()))
            usage.memory_peak_bytes = _int_or_none(_read(folder / "memory.peak"))
            usage.memory_limit_bytes = _int_or_none(_read(folder / "memory.max"))
            usage.oom_kills = _keyed(_read(folder / "memory.events")).get("oom_kill", 0)
            usec = _keyed(_read(folder / "cpu.stat")).get("usage_usec")
            usage.cpu_seconds = usec / 1e6 if usec is not None else None
            return usage
        if "memory" in self.folders:
            folder = self.folders["memory"]
            usage.memory_peak_bytes = _int_or_none(_read(folder / "memory.max_usage_in_bytes"))
            limit = _int_or_none(_read(folder / "memory.limit_in_bytes"))
            usage.memory_limit_bytes = limit if limit is not None and limit < 2**62 else None
            usage.oom_kills = _keyed(_read(folder / "memory.oom_control")).get("oom_kill", 0)
        if "cpuacct" in self.folders:
            nanoseconds = _int_or_none(_read(self.folders["cpuacct"] / "cpuacct.usage"))
            usage.cpu_seconds = nanoseconds / 1e9 if nanoseconds is not None else None
        return usage

    def kill(self) -> None:
        """SIGKILL every process still in the cgroup (what escaped the process group)."""
        import signal

        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def remove(self, wait_s: float = 5.0) -> bool:
        """Delete the cgroup once its processes are gone (killing stragglers). True if removed."""
        deadline = time.monotonic() + wait_s
        folders = sorted(set(self.folders.values()), key=lambda p: len(p.parts), reverse=True)
        while True:
            remaining = []
            for folder in folders:
                try:
                    folder.rmdir()
                except FileNotFoundError:
                    pass
                except OSError:
                    remaining.append(folder)
            if not remaining:
                return True
            if time.monotonic() > deadline:
                return False
            self.kill()
            folders = remaining
            time.sleep(0.05)


def attempt_name(attempt_id: str) -> str:
    """``<creator pid>-<attempt id>``: unique per attempt, and tells :meth:`Host.sweep` whose it is."""
    return f"{os.getpid()}-{attempt_id}"


def join(procs_files: Iterable[str]) -> None:
    """In a just-forked child: put this process into its attempt's cgroup before anything else."""
    pid = str(os.getpid())
    for path in procs_files:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, pid.encode())
        finally:
            os.close(fd)


def human_bytes(n: float) -> str:
    """``4.0 GiB``, ``512.0 MiB``: what a person reads in an OOM message."""
    if n >= 2**30:
        return f"{n / 2**30:.1f} GiB"
    return f"{n / 2**20:.1f} MiB"


def limit_text(n: int) -> str:
    """A limit as asked: ``4 GiB``, ``1.5 GiB``, ``512 MiB``."""
    if n >= 2**30:
        return f"{n / 2**30:g} GiB"
    return f"{n / 2**20:g} MiB"


# --------------------------------------------------------------------------- small helpers


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _write(path: Path, value: str) -> None:
    # One write() per value: cgroup files take a value per write call, not a stream.
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _int_or_none(text: str) -> int | None:
    text = text.strip()
    if re.fullmatch(r"\d+", text):
        return int(text)
    return None


def _keyed(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and re.fullmatch(r"\d+", parts[1]):
            out[parts[0]] = int(parts[1])
    return out
