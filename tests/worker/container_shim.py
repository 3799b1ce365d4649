#!/usr/bin/env python3
"""A recording stand-in for podman/docker (no container runtime works on these machines).

Every call's arguments are appended as one JSON line to ``$CONTAINER_SHIM_LOG``. ``run``
then does what the container would, on the host: it runs the command after the image
with the ``--env`` values, the code from where ``/opt/yoloportal/worker`` is mounted from,
and this interpreter for ``python``. ``inspect`` says the container was not OOM-killed;
``stop``/``rm`` succeed. This proves the command line and the event contract, not a runtime.
"""

from __future__ import annotations

import json
import os
import sys

WITH_VALUE = {"--name", "--network", "--workdir", "--gpus", "--memory", "--memory-swap", "--cpus",
              "--pids-limit", "--volume", "--env"}


def main() -> None:
    args = sys.argv[1:]
    with open(os.environ["CONTAINER_SHIM_LOG"], "a") as log:
        log.write(json.dumps(args) + "\n")
    if not args or args[0] != "run":
        if args and args[0] == "inspect":
            print("false")
        return
    env: dict[str, str] = {}
    code_root = None
    i = 1
    while i < len(args) and args[i].startswith("--"):
        flag = args[i]
        if flag not in WITH_VALUE:
            i += 1
            continue
        value = args[i + 1]
        i += 2
        if flag == "--env":
            key, _, val = value.partition("=")
            env[key] = val
        elif flag == "--volume":
            source, target, _mode = value.rsplit(":", 2)
            if target == "/opt/yoloportal/worker":
                code_root = os.path.dirname(source)
    command = args[i + 1:]
    if command and command[0] == "python":
        # The image's interpreter: here the test's own (CONTAINER_SHIM_PYTHON), which has Ultralytics.
        command[0] = os.environ.get("CONTAINER_SHIM_PYTHON") or sys.executable
    env["PYTHONPATH"] = code_root or ""
    env["PATH"] = os.environ.get("PATH", "/usr/bin:/bin")
    os.chdir(code_root or "/")
    os.execve(command[0], command, env)


if __name__ == "__main__":
    main()
