"""Node-local GPU locks, so a job never starts on a GPU the previous job has not left yet.

The scheduler frees a preempted or reaped attempt's GPUs in the database at once, but its
process tree may need a few seconds to stop (next check-in, then SIGTERM grace). Each
attempt holds a lock file per GPU for its lifetime: exclusive for whole GPUs, shared for
fractional ones (which share a GPU by design). A new attempt waits for the locks before it
starts training. The locks are flock()s held by the work-horse, so they vanish with it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
from pathlib import Path


def lock_dir(node: str, data_dir: Path) -> Path:
    # Per node and per installation: two test runs (or two portals) on one machine keep apart.
    tag = hashlib.sha256(str(data_dir).encode()).hexdigest()[:10]
    path = Path(tempfile.gettempdir()) / f"yoloportal-gpu-locks-{tag}" / node
    path.mkdir(parents=True, exist_ok=True)
    return path


class GpuLocks:
    def __init__(self, folder: Path, indices: list[int], *, exclusive: bool) -> None:
        self.paths = [folder / f"gpu{index}.lock" for index in sorted(indices)]
        self.mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        self.fds: list[int] = []

    def try_acquire(self) -> bool:
        """All or nothing, without blocking."""
        for path in self.paths:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, self.mode | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                self.release()
                return False
            self.fds.append(fd)
        return True

    def release(self) -> None:
        for fd in self.fds:
            os.close(fd)  # closing drops the flock
        self.fds = []
