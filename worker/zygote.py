"""A preloaded template process that forks training children.

Importing torch and Ultralytics costs 2–3 s of CPU per job; a zygote pays it once per
node and forks each training child from the warm interpreter, so a job starts training
that much sooner. The worker parent starts it (``python -m worker.zygote ADDRESS DIR``);
work-horses ask it for children over a Unix socket.

The socket is abstract (``@yoloportal-zygote-<node>-<worker pid>``, no file): the kernel
removes it when the zygote dies, however it dies — a file in /tmp outlived every SIGTERM
and SIGKILL (a thousand of them piled up under the tests). An abstract socket has no file
mode, so the zygote checks each caller itself (``_caller_allowed``): same uid, and a
descendant of the gpu_worker that started it but not of the zygote (its slots' work-horses,
not the trainings it forked) — stricter than the file's 0600, which let any process of the
user in. And since anyone may bind the name first, a horse checks the listener's uid too
(``ZygoteChild``) and otherwise falls back to a fresh interpreter.

Protocol (one connection per child, JSON lines):
  horse → zygote  {"config": path, "log": path, "env": {...}, "cwd": dir, "owner": horse pid,
                   "cgroup": [cgroup.procs paths of the attempt's cgroup]}
  zygote → horse  {"pid": child pid}        once forked
  zygote → horse  {"exit": code}            when the child exits (negative: killed by a signal)

The child is not the horse's child, so two things the kernel does for a parent are
done by hand: the zygote reaps the child and relays its exit code, and the child
watches its owner through a pidfd and kills its own process group when the owner dies
(what PR_SET_PDEATHSIG does for a plain subprocess).

CUDA does not survive a fork once initialised. The zygote never touches CUDA (PyTorch's
NVML-based availability check keeps ``torch.cuda.is_available()`` from initialising
it). Verified on CPU nodes by the tests and on an NVIDIA H200 by scripts/gpu_check.sh
(docs/gpu-check.md: training, a CUDA out-of-memory retry and an FP16 export all forked from the
zygote), so the worker uses it on every node unless ``TRAINER_PRELOAD=false``.
"""

from __future__ import annotations

import errno
import json
import os
import selectors
import signal
import socket
import struct
import sys
import threading
import time
from pathlib import Path

from worker.executors.cgroups import join as cgroup_join


def sockaddr(address: str) -> str:
    """``@name`` (an abstract socket, as ss(8) writes it; an environment variable cannot hold
    the NUL) → the address to bind/connect; anything else is a file path."""
    return "\0" + address[1:] if address.startswith("@") else address


def descends_from(pid: int, ancestor: int) -> bool:
    """Whether ``pid`` is ``ancestor`` or one of its descendants (walks /proc/<pid>/stat)."""
    for _ in range(256):
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat.rsplit(")", 1)[1].split()[1])  # after the command name: state, ppid
        except (OSError, IndexError, ValueError):
            return False
    return False


def peer(conn: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a Unix socket (``SO_PEERCRED``)."""
    pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                         struct.calcsize("3i")))
    return pid, uid


def _caller_allowed(conn: socket.socket, parent: int, zygote: int | None = None) -> bool:
    """Only our gpu_worker's own processes may have children forked (see the module doc)."""
    pid, uid = peer(conn)
    # Not the zygote's own children (the trainings): they descend from the worker too.
    return (uid == os.getuid() and descends_from(pid, parent)
            and (zygote is None or not descends_from(pid, zygote)))


def _listen(address: str) -> socket.socket:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if not address.startswith("@"):
        Path(address).unlink(missing_ok=True)
    for attempt in range(50):  # a zygote replaced at once may still be closing the old one
        try:
            listener.bind(sockaddr(address))
            break
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or attempt == 49:
                raise
            time.sleep(0.1)
    if not address.startswith("@"):
        os.chmod(address, 0o600)
    listener.listen(64)
    return listener


def _read_line(conn: socket.socket, limit: int = 1 << 20) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
        if len(data) > limit:
            raise ValueError("request too large")
    return data


def _watch_owner(owner: int) -> None:
    """In the child: kill our whole process group when the owning work-horse exits."""
    try:
        fd = os.pidfd_open(owner)
    except ProcessLookupError:
        os.killpg(0, signal.SIGKILL)
        return

    def wait() -> None:
        import select

        select.select([fd], [], [])
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=wait, name="owner-watch", daemon=True).start()


def _child(request: dict, inherited: list) -> None:
    """Runs in the forked child; never returns."""
    code = 1
    try:
        # Into the attempt's cgroup before touching anything: pages shared with the zygote
        # stay charged to it, but everything this child allocates from here on counts
        # against the attempt's own limit (worker/executors/cgroups.py).
        try:
            cgroup_join(request.get("cgroup") or [])
        except OSError as exc:
            with open(os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644),
                      "a") as log:
                log.write(f"cannot join the attempt's cgroup (its limits would not hold): {exc}\n")
            os._exit(3)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        # Close every descriptor of the zygote's: a sibling's connection held open here
        # would hide the zygote's death from that sibling's horse.
        for s in inherited:
            s.close()
        os.setsid()
        try:  # `ps` (and the tests) should see which job this process trains
            import setproctitle

            setproctitle.setproctitle(f"python -m worker.train_child {request['config']}")
        except ImportError:
            pass
        # Not through a link the job's previous child left in its folder (sec21, F2).
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(devnull)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        _watch_owner(int(request["owner"]))
        from worker import train_child

        code = train_child.main([request["config"]])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - report anything, then leave without cleanup
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve(address: str, config_dir: Path) -> None:
    """Preload, then fork a child per request until our parent (the gpu_worker) goes away."""
    from worker import train_child

    parent = os.getppid()
    train_child.preload(config_dir)
    listener = _listen(address)
    wake_r, wake_w = socket.socketpair()
    wake_r.setblocking(False)
    wake_w.setblocking(False)
    signal.set_wakeup_fd(wake_w.fileno())
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(wake_r, selectors.EVENT_READ, "signal")
    children: dict[int, socket.socket] = {}
    print(f"zygote ready on {address} (pid {os.getpid()})", flush=True)
    while os.getppid() == parent:
        for key, _ in selector.select(timeout=1.0):
            if key.data == "accept":
                conn, _ = listener.accept()
                try:
                    if not _caller_allowed(conn, parent, zygote=os.getpid()):
                        raise ValueError("the caller is not one of this node's work-horses")
                    conn.settimeout(5)
                    request = json.loads(_read_line(conn))
                    pid = os.fork()
                    if pid == 0:
                        _child(request, [listener, conn, wake_r, wake_w, selector, *children.values()])
                    children[pid] = conn
                    conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
                except (OSError, ValueError) as exc:
                    print(f"zygote: bad request: {exc}", flush=True)
                    conn.close()
            else:
                try:
                    while wake_r.recv(512):
                        pass
                except BlockingIOError:
                    pass
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = children.pop(pid, None)
            if conn is not None:
                try:
                    conn.sendall(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
                except OSError:
                    pass  # the horse is gone; its child watched it and is gone too
                conn.close()
    if not address.startswith("@"):
        Path(address).unlink(missing_ok=True)


class ZygoteChild:
    """The horse's handle on a child forked by the zygote; mirrors the bits of Popen we use."""

    def __init__(self, address: str, *, config: str, log: str, env: dict, cwd: str,
                 cgroup: list[str] | None = None) -> None:
        self.conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.conn.settimeout(10)
        self.conn.connect(sockaddr(address))  # ConnectionRefusedError: not listening (yet)
        # An abstract name can be bound by anyone in this network namespace first: only a
        # listener with our uid is our zygote (its replies name pids we signal).
        _pid, uid = peer(self.conn)
        if uid != os.getuid():
            self.conn.close()
            raise OSError(f"{address} is held by uid {uid}, not by this worker's zygote")
        request = {"config": config, "log": log, "env": env, "cwd": cwd, "owner": os.getpid(),
                   "cgroup": cgroup or []}
        self.conn.sendall(json.dumps(request).encode() + b"\n")
        self.buffer = b""
        reply = self._next_message(block=True)
        if not reply or "pid" not in reply:
            raise OSError(f"zygote did not start the child: {reply!r}")
        self.pid = int(reply["pid"])
        self.returncode: int | None = None
        self.conn.setblocking(False)

    def _next_message(self, block: bool) -> dict | None:
        while b"\n" not in self.buffer:
            try:
                chunk = self.conn.recv(4096) if block else self.conn.recv(4096, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return None
            if not chunk:
                # The zygote died, so nobody can report this child's exit any more: stop it
                # (it would die with this horse anyway) and treat the attempt as killed.
                if getattr(self, "pid", None):
                    try:
                        os.killpg(self.pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
                return {"exit": -signal.SIGKILL}
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def poll(self) -> int | None:
        if self.returncode is None:
            message = self._next_message(block=False)
            if message and "exit" in message:
                self.returncode = int(message["exit"])
                self.conn.close()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                import subprocess

                raise subprocess.TimeoutExpired("zygote child", timeout)
            time.sleep(0.05)
        return self.returncode


if __name__ == "__main__":
    serve(sys.argv[1], Path(sys.argv[2]))
