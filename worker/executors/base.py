"""The executor interface: start an attempt, poll it, stop it, collect what it reports.

One training child (``worker/train_child.py``, its event contract in the docstring there)
runs the same way everywhere; executors differ only in *where* it runs:

- ``local``     (:mod:`.local`): a process group on this node, in its own cgroup;
- ``container`` (:mod:`.container`): ``podman``/``docker run`` of the job's image;
- ``slurm``     (:mod:`.slurm`): ``sbatch`` on an existing Slurm cluster, with a relay
  beside the child that sends its events to the portal's API.

The scheduler places attempts for every executor; an executor never chooses a node.
This module has no Django: the Slurm relay, far from the database, imports it too.
"""

from __future__ import annotations

import codecs
import json
import logging
import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from worker.train_child import EXIT_CHECKPOINT

from .cgroups import Limits, Usage, human_bytes, limit_text

log = logging.getLogger("yoloportal.worker")

KILL_GRACE_S = 5.0


@dataclass(frozen=True)
class AttemptSpec:
    """One run of the training child, in plain values (no Django objects)."""

    key: str  # the attempt's id: names its cgroup, container or Slurm job
    config_path: Path  # the child's config JSON (worker/train_child.py)
    events_path: Path
    log_path: Path
    env: dict[str, str]  # the child's whole environment (already allow-listed)
    cwd: Path
    limits: Limits = field(default_factory=Limits)
    gpu_indices: tuple[int, ...] = ()  # physical GPUs on the node; () = CPU
    image: str = ""
    read_only: tuple[Path, ...] = ()  # what a container sees read-only (dataset, weights, the child's code)
    writable: tuple[Path, ...] = ()  # and read-write (the job's folder)
    # Folders inside a read-only mount that the container must not see: other teams' folders
    # of the shared weights store (sec21, F4). Each is covered by an empty read-only tmpfs.
    hidden: tuple[Path, ...] = ()


class Execution(Protocol):
    """A started attempt."""

    pid: int | None
    log_reader: LogReader  # the child's output (the runner stores it and bounds the file)

    def poll(self) -> int | None:
        """The exit code once it has ended (negative: killed by that signal), else None."""

    def stop(self) -> None:
        """Stop the whole tree: SIGTERM, a grace period, then SIGKILL. Waits until it has ended."""

    def events(self) -> list[dict]:
        """Events the child wrote since the last call."""

    def usage(self) -> Usage | None:
        """What its cgroup measured (None where the executor cannot say)."""

    def close(self) -> None:
        """Give back what the executor holds for it (its cgroup); after it has ended."""


class Executor(Protocol):
    name: str

    def start(self, spec: AttemptSpec) -> Execution: ...


# --- outcome of one run -----------------------------------------------------------------------


def run_outcome(*, exit_code: int | None, finished: dict | None, resumed: bool, stop_reason: str = "",
                usage: Usage | None = None) -> str:
    """The worker's word for how one run of the child ended.

    succeeded | out_of_memory (the kernel's OOM killer acted in its cgroup) |
    checkpoint_unusable (exit 4 while resuming: try an older checkpoint) |
    killed (a signal we did not send) | failed; or ``stop_reason`` when we stopped it
    (cancelled, fenced, timed_out).
    """
    if stop_reason:
        return stop_reason
    if exit_code == 0 and finished:
        return "succeeded"
    if usage is not None and usage.oom_kills:
        # Also when the victim was a dataloader worker and the child then failed on its own.
        return "out_of_memory"
    if exit_code == EXIT_CHECKPOINT and resumed:
        return "checkpoint_unusable"
    if exit_code is not None and exit_code < 0:
        return "killed"
    return "failed"


# What the job was doing, for an error the child could not classify ("training error" was
# said of a failed export too; a new-user trial found it).
MODE_NOUNS = {"train": "training", "val": "validation", "predict": "prediction", "export": "export"}


def error_lines(error: dict, mode: str) -> list[str]:
    """The child's classified error (``kind``, ``message``, ``advice``) as the job's error text,
    for a local attempt and a Slurm one alike."""
    kind = error.get("kind", "exception")
    label = {"oom": "CUDA out of memory" if error.get("cuda") else "out of memory",
             "data": "dataset problem", "weights": "weights refused",
             "export": "export verification failed"}.get(kind, f"{MODE_NOUNS.get(mode, mode)} error")
    lines = [f"{label}: {error.get('message', '')}".strip()]
    if error.get("advice"):
        lines.append(f"Advice: {error['advice']}")
    return lines


def oom_message(usage: Usage) -> str:
    """``out of memory: used 4.0 GiB of its 4 GiB limit — ask for more memory or a smaller …``"""
    used = usage.memory_peak_bytes or usage.memory_limit_bytes or 0
    limit = f" of its {limit_text(usage.memory_limit_bytes)} limit" if usage.memory_limit_bytes else ""
    return (f"out of memory: used {human_bytes(used)}{limit} — ask for more memory "
            f"or a smaller batch/imgsz/cache")


# --- reading what the child writes -------------------------------------------------------------
#
# The job's folder is the child's to write (a container job runs the team's own image), so any
# name in it may have been swapped for a symlink, a hard link or a pipe by the time the worker
# opens it: to another team's dataset, the database. The worker, which can read and write all
# of those, opens the child's files only through :func:`own_file_open` (sec21, F2).


class NotOwnFile(OSError):
    """The name is not a plain file of the job's own folder (a link out of it, a pipe)."""


def own_file_open(path: Path, flags: int, *, folder: Path) -> int:
    """An open descriptor of ``path``, checked *after* opening: a regular file with one link,
    really inside ``folder`` (a resolved path). Symlinks are not followed (``O_NOFOLLOW`` on the
    name, and the opened file's real path — ``/proc/self/fd`` — for a folder swapped on the
    way); a pipe does not block the open. FileNotFoundError when missing; NotOwnFile else."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise NotOwnFile(exc.errno, f"{path}: not a plain file of the job's folder ({exc.strerror})") from None
    try:
        status = os.fstat(fd)
        try:
            real = Path(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # no /proc (not Linux): the name's real path, read after the open
            real = Path(os.path.realpath(path))
        if not (status.st_mode & 0o170000 == 0o100000 and status.st_nlink == 1 and real.is_relative_to(folder)):
            raise NotOwnFile(0, f"{path}: not a plain file of the job's folder (it is {real})")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def own_file_read(path: Path, *, folder: Path, offset: int = 0, size: int = -1) -> bytes:
    """Up to ``size`` bytes (all: -1) of the child's file from ``offset``; b'' when it is missing or
    not the job's own (logged)."""
    try:
        fd = own_file_open(path, os.O_RDONLY, folder=folder)
    except FileNotFoundError:
        return b""
    except NotOwnFile as exc:
        log.warning("not reading %s", exc)
        return b""
    with os.fdopen(fd, "rb") as f:
        f.seek(offset)
        return f.read(size)


def own_file_create(path: Path, *, folder: Path, append: bool = False) -> int:
    """A descriptor for the worker to write ``path`` in the job's folder ``folder`` (resolved; its
    config, the child's output, restored checkpoints): a name that is not a plain file of the
    folder (a link planted by an earlier child) is removed first, and the file is then created
    without following anything. NotOwnFile when a folder on the way leads out of ``folder``."""
    # Emptied only once checked (O_TRUNC would empty whatever the name led to before the check).
    flags = os.O_WRONLY | (os.O_APPEND if append else 0)
    fd = None
    try:
        fd = own_file_open(path, flags, folder=folder)
    except FileNotFoundError:
        pass
    except NotOwnFile as exc:
        if not path.parent.resolve().is_relative_to(folder):  # a folder swapped for a link: remove nothing there
            raise
        log.warning("replacing %s", exc)
        path.unlink()
    if fd is None:
        if not path.parent.resolve().is_relative_to(folder):  # create nothing in a folder the name was led to
            raise NotOwnFile(0, f"{path}: its folder is not the job's own")
        fd = own_file_open(path, flags | os.O_CREAT | os.O_EXCL, folder=folder)
    if not append:
        os.ftruncate(fd, 0)
    return fd


class EventReader:
    """Reads complete JSON lines appended to the child's events file."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.partial = path, 0, b""
        self.folder = path.parent.resolve()  # the worker made it before the child started

    def read(self) -> list[dict]:
        data = own_file_read(self.path, folder=self.folder, offset=self.offset)
        if not data:
            return []
        self.offset += len(data)
        data = self.partial + data
        *lines, self.partial = data.split(b"\n")
        events = []
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                log.warning("ignoring a malformed event line: %r", line[:200])
                continue
            if isinstance(event, dict):
                events.append(event)
        return events


class LogReader:
    """Reads new output; progress bars' carriage-return updates collapse to their last state.

    A line is handed on once its newline is there; ``read(final=True)``, once the child has
    exited, hands on the rest too (a last line without a newline was lost before: a crash
    message or a summary ``print(..., end="")``). Bytes are decoded incrementally, so a
    character split across two reads is not mangled.
    """

    CHUNK = 1 << 20

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, 0
        self.folder = path.parent.resolve()  # the worker made it before the child started
        self._restart()

    def _restart(self) -> None:
        self.partial = ""
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def truncate(self) -> None:
        """Empty the file and read on from its start (the child appends: O_APPEND)."""
        try:
            fd = own_file_open(self.path, os.O_WRONLY, folder=self.folder)
        except OSError:
            return
        try:
            os.ftruncate(fd, 0)
        finally:
            os.close(fd)
        self.offset = 0
        self._restart()

    def read(self, final: bool = False) -> str:
        """The complete lines written since the last read (up to ``CHUNK`` bytes of them);
        ``final``: everything left, the unterminated last line included."""
        parts = [self.partial]
        while True:
            data = own_file_read(self.path, folder=self.folder, offset=self.offset, size=self.CHUNK)
            self.offset += len(data)
            parts.append(self.decoder.decode(data))
            if not final or len(data) < self.CHUNK:
                break
        if final:
            parts.append(self.decoder.decode(b"", final=True))
        *lines, self.partial = "".join(parts).split("\n")
        if final:
            lines.append(self.partial)
            self._restart()
        return "".join(line.rsplit("\r", 1)[-1].rstrip() + "\n" for line in lines if line.rsplit("\r", 1)[-1].strip())


def kill_tree(child, grace_s: float = KILL_GRACE_S) -> None:
    """SIGTERM the child's process group, SIGKILL what is left after a grace period."""
    try:
        os.killpg(child.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        child.wait(grace_s)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    child.wait()
