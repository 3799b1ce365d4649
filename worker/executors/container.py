"""The container executor: the training child inside the job's image (podman or docker).

UNPROVEN HERE: no container runtime works on the machines this was written on (podman's
crun refuses hybrid cgroups, docker has no daemon; see REFERENCES.md). The command line is
tested exactly against a recording shim on ``PATH``, and the event contract end to end
through that shim; the real runtime is exercised only where one answers.

``<runtime> run`` with:

- ``--gpus device=<indices>`` (the node's physical GPUs for the attempt; none on CPU);
- the attempt's limits: ``--memory``/``--memory-swap`` (no swap beyond it), ``--cpus``,
  ``--pids-limit``; ``--network none`` (nothing is downloaded at run time anyway);
- the job's folder mounted read-write and the dataset, weights store and the child's own
  code (``worker/``, ``apps/core/``) read-only, at the same paths as on the host, so the
  child's config needs no translation; the worker's data folder (secrets, database) is
  never mounted, and other teams' folders of the weights store are covered by an empty
  tmpfs (the image is the team's own code: it must not read their weights);
- the child's allow-listed environment with ``-e``, ``PYTHONPATH`` pointing at the
  mounted code; ``python -m worker.train_child CONFIG`` as the command.

The container is kept after it exits (no ``--rm``) so ``inspect`` can tell whether the
kernel killed it for memory; :meth:`ContainerExecution.close` removes it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

from .base import AttemptSpec, EventReader, LogReader, kill_tree, own_file_create
from .cgroups import Usage
from .local import set_parent_death_signal

log = logging.getLogger("yoloportal.worker")

CODE_ROOT = Path("/opt/yoloportal")  # where the child's code is mounted inside the image
# Host paths that mean nothing inside an image: the image brings its own interpreter.
HOST_ONLY_ENV = frozenset({"PATH", "HOME", "VIRTUAL_ENV", "PYTHONPATH", "LD_LIBRARY_PATH", "TMPDIR"})
STOP_GRACE_S = 5


def container_name(spec: AttemptSpec) -> str:
    return f"yp-{spec.key}"


def run_command(runtime: str, spec: AttemptSpec, *, base_dir: Path) -> list[str]:
    """The exact ``<runtime> run …`` command line for ``spec`` (``base_dir``: the portal's source)."""
    command = [runtime, "run", "--name", container_name(spec), "--init", "--network", "none",
               "--workdir", str(CODE_ROOT)]
    if spec.gpu_indices:
        command += ["--gpus", f"device={','.join(map(str, spec.gpu_indices))}"]
    limits = spec.limits
    if limits.memory_bytes:
        command += ["--memory", f"{limits.memory_bytes}b", "--memory-swap", f"{limits.memory_bytes}b"]
    if limits.cpus:
        command += ["--cpus", f"{limits.cpus:g}"]
    if limits.pids:
        command += ["--pids-limit", str(limits.pids)]
    for path in spec.writable:
        command += ["--volume", f"{path}:{path}:rw"]
    for path in spec.read_only:
        if path in (base_dir / "worker", base_dir / "apps" / "core"):
            continue  # the child's code: mounted below under CODE_ROOT
        command += ["--volume", f"{path}:{path}:ro"]
    for path in spec.hidden:
        command += ["--tmpfs", f"{path}:ro,size=4k"]
    command += ["--volume", f"{base_dir / 'worker'}:{CODE_ROOT / 'worker'}:ro",
                "--volume", f"{base_dir / 'apps' / '__init__.py'}:{CODE_ROOT / 'apps' / '__init__.py'}:ro",
                "--volume", f"{base_dir / 'apps' / 'core'}:{CODE_ROOT / 'apps' / 'core'}:ro"]
    env = {k: v for k, v in spec.env.items() if k not in HOST_ONLY_ENV}
    env["PYTHONPATH"] = str(CODE_ROOT)
    for key in sorted(env):
        command += ["--env", f"{key}={env[key]}"]
    if spec.image.startswith("-"):  # read as an option of the run (--privileged), not as the image
        raise ValueError(f"not a container image: {spec.image!r}")
    command += [spec.image, "python", "-m", "worker.train_child", str(spec.config_path)]
    return command


class ContainerExecution:
    def __init__(self, process: subprocess.Popen, runtime: str, spec: AttemptSpec) -> None:
        self.process = process
        self.pid = process.pid
        self.runtime = runtime
        self.name = container_name(spec)
        self.memory_limit = spec.limits.memory_bytes
        self._events = EventReader(spec.events_path)
        self.log_reader = LogReader(spec.log_path)
        self._usage: Usage | None = None

    def poll(self) -> int | None:
        code = self.process.poll()
        if code is not None and code > 128:
            return -(code - 128)  # the runtime reports a signal death as 128 + signal
        return code

    def stop(self) -> None:
        # The runtime's client is not the container: ask the runtime to stop it, then the client.
        self._runtime("stop", "--time", str(STOP_GRACE_S), self.name, timeout=STOP_GRACE_S + 30)
        kill_tree(self.process)

    def events(self) -> list[dict]:
        return self._events.read()

    def usage(self) -> Usage | None:
        if self._usage is None and self.process.poll() is not None:
            out = self._runtime("inspect", "--format", "{{.State.OOMKilled}}", self.name)
            self._usage = Usage(memory_limit_bytes=self.memory_limit,
                                oom_kills=1 if out.strip().lower() == "true" else 0)
        return self._usage

    def close(self) -> None:
        self._runtime("rm", "--force", self.name)

    def _runtime(self, *args: str, timeout: float = 30) -> str:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            return subprocess.run([self.runtime, *args], capture_output=True, text=True, timeout=timeout).stdout
        return ""


class ContainerExecutor:
    name = "container"

    def __init__(self, *, runtime: str = "podman", base_dir: Path | None = None, default_image: str = "") -> None:
        self.runtime = shutil.which(runtime) or runtime
        self.base_dir = base_dir or Path(__file__).resolve().parents[2]
        self.default_image = default_image  # for a job that names no image

    def start(self, spec: AttemptSpec) -> ContainerExecution:
        if not spec.image:
            if not self.default_image:
                raise ValueError("the container executor needs the job's image (spec 'image:')")
            spec = replace(spec, image=self.default_image)
        command = run_command(self.runtime, spec, base_dir=self.base_dir)
        with os.fdopen(own_file_create(spec.log_path, folder=spec.log_path.parent.resolve(), append=True),
                       "ab") as log_file:
            process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       start_new_session=True, preexec_fn=set_parent_death_signal)
        return ContainerExecution(process, self.runtime, spec)
