"""The zygote's socket (worker/zygote.py): abstract, and only the worker's own processes get a child.

That it leaves nothing behind when the worker stops or is killed is checked live, in
tests/integration/test_faults.py (``assert_no_zygote_socket``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from worker import zygote
from worker.management.commands.gpu_worker import zygote_address


def connect_script(address: str) -> str:
    return (f"import socket, time; s = socket.socket(socket.AF_UNIX); s.connect({zygote.sockaddr(address)!r}); "
            "time.sleep(30)")


def test_only_a_descendant_of_the_worker_with_our_uid_may_ask_for_a_child():
    address = zygote_address("test", os.getpid())
    assert address.startswith("@")  # abstract: no file to outlive the zygote
    listener = zygote._listen(address)
    listener.settimeout(20)
    processes = []
    try:
        # One of "the worker's" (this process's) own children, like a slot's work-horse.
        processes.append(subprocess.Popen([sys.executable, "-c", connect_script(address)]))
        own, _ = listener.accept()
        assert zygote._caller_allowed(own, parent=os.getpid())
        # A training the zygote forked descends from the worker too, but may not ask for a
        # child outside its attempt's cgroup (here the caller stands in for the zygote's child).
        assert not zygote._caller_allowed(own, parent=os.getpid(), zygote=processes[0].pid)
        assert not zygote._caller_allowed(own, parent=processes[0].pid + 100_000)  # another worker's
        # Another process of the same user: orphaned at once (its shell exits), so not ours.
        shell = subprocess.run(["sh", "-c", f'{sys.executable} -c "{connect_script(address)}" >/dev/null 2>&1 & '
                                            'echo $!'], capture_output=True, text=True, check=True)
        processes.append(int(shell.stdout))
        other, _ = listener.accept()
        assert not zygote._caller_allowed(other, parent=os.getpid())
    finally:
        listener.close()
        for process in processes:
            if isinstance(process, int):
                os.kill(process, 9)
            else:
                process.kill()
                process.wait()
    assert zygote.descends_from(os.getpid(), os.getpid()) and not zygote.descends_from(os.getpid(), 2**22 + 7)



@pytest.mark.skipif(os.getuid() != 0, reason="binding the name as another user needs root")
def test_a_horse_refuses_a_zygote_name_another_user_took_first():
    """Anyone may bind an abstract name first; a horse talks only to a listener with its uid
    (the replies name pids it signals). Refused with an OSError, so spawn falls back to a fresh
    interpreter (worker/executors/local.py)."""
    import socket
    import time

    address = zygote_address("squat", os.getpid())
    ready_r, ready_w = os.pipe()
    squatter = os.fork()  # not an exec: user nobody may not reach this venv's interpreter
    if squatter == 0:
        try:
            os.setgid(65534)
            os.setuid(65534)
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(zygote.sockaddr(address))
            listener.listen(1)
            os.write(ready_w, b"r")
            time.sleep(60)
        finally:
            os._exit(0)
    try:
        assert os.read(ready_r, 1) == b"r"
        with pytest.raises(OSError, match="held by uid 65534"):
            zygote.ZygoteChild(address, config="c", log="l", env={}, cwd="/")
    finally:
        os.kill(squatter, 9)
        os.waitpid(squatter, 0)
        os.close(ready_r)
        os.close(ready_w)
