"""The local executor: the training child as a process group on this node, in its own cgroup.

1. Create the attempt's cgroup under the worker's own (:mod:`.cgroups`) with its limits:
   memory = the memory asked for, CPU quota = the CPUs asked for (at most the machine's),
   a pids limit. Where the host enforces nothing the child runs without one (the node
   said so at registration).
2. Start the child so that it is inside that cgroup before it allocates anything: a fresh
   interpreter joins in ``preexec_fn`` (between fork and exec); a child forked by the
   preloaded zygote joins first thing after the fork (``worker/zygote.py``), and the
   horse writes its pid once more as a guard.
3. Poll it, read its events and output, stop its whole tree on cancel/timeout/fencing,
   and read the cgroup's measurements (peak memory, OOM kills, CPU time) at the end.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

from . import cgroups
from .base import AttemptSpec, EventReader, LogReader, kill_tree, own_file_create
from .cgroups import AttemptCgroup, Host, Usage

log = logging.getLogger("yoloportal.worker")


def set_parent_death_signal() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (PR_SET_PDEATHSIG)."""
    import ctypes
    import signal

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except OSError:
        pass


class LocalExecution:
    def __init__(self, process, cgroup: AttemptCgroup | None, spec: AttemptSpec) -> None:
        self.process = process
        self.pid = process.pid
        self.cgroup = cgroup
        self._events = EventReader(spec.events_path)
        self.log_reader = LogReader(spec.log_path)

    def poll(self) -> int | None:
        return self.process.poll()

    def stop(self) -> None:
        kill_tree(self.process)
        if self.cgroup is not None:
            self.cgroup.kill()  # anything that left the process group (setsid) goes too

    def events(self) -> list[dict]:
        return self._events.read()

    def usage(self) -> Usage | None:
        return self.cgroup.usage() if self.cgroup is not None else None

    def close(self) -> None:
        if self.cgroup is not None and not self.cgroup.remove():
            log.warning("attempt cgroup %s still has processes %s", self.cgroup.folders, self.cgroup.pids())


class LocalExecutor:
    """``host``: this node's cgroups (None or nothing enforced = no cgroup); ``zygote``: the
    preloaded template process's socket address (``@name``: abstract), when the node runs one."""

    name = "local"

    def __init__(self, *, host: Host | None = None, zygote: str | None = None,
                 module: str = "worker.train_child") -> None:
        self.host = host
        self.zygote = zygote
        self.module = module  # the child's module (worker.fast_child in stress tests)

    def start(self, spec: AttemptSpec) -> LocalExecution:
        cgroup = None
        if self.host is not None and self.host.enforced:
            cgroup = self.host.create(cgroups.attempt_name(spec.key), spec.limits)
        try:
            process = self._spawn(spec, cgroup)
        except BaseException:
            if cgroup is not None:
                cgroup.remove()
            raise
        return LocalExecution(process, cgroup, spec)

    def _spawn(self, spec: AttemptSpec, cgroup: AttemptCgroup | None):
        procs = cgroup.procs_files if cgroup is not None else []
        if self.zygote is not None:
            from worker.zygote import ZygoteChild

            try:
                child = ZygoteChild(self.zygote, config=str(spec.config_path), log=str(spec.log_path),
                                    env=spec.env, cwd=str(spec.cwd), cgroup=procs)
            except (ConnectionRefusedError, FileNotFoundError):
                pass  # still preloading (or being restarted): a fresh interpreter this time
            except (OSError, ValueError) as exc:
                log.warning("zygote unavailable (%s); starting a fresh interpreter", exc)
            else:
                if cgroup is not None:
                    try:  # the child joined itself; make sure (a no-op if it did)
                        cgroup.add(child.pid)
                    except ProcessLookupError:
                        pass  # it has already ended: its exit code says how
                return child

        def preexec() -> None:
            set_parent_death_signal()
            cgroups.join(procs)

        with os.fdopen(own_file_create(spec.log_path, folder=spec.log_path.parent.resolve(), append=True),
                       "ab") as log_file:
            return subprocess.Popen(
                [sys.executable, "-m", self.module, str(spec.config_path)],
                cwd=str(spec.cwd), env=spec.env, stdout=log_file, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=preexec,
            )


def host_cgroups() -> Host | None:
    """This node's cgroups, probed once per process (the horse inherits the worker's answer)."""
    global _host
    if _host is None:
        _host = cgroups.probe()
    return _host


_host: Host | None = None
