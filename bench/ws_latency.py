"""Benchmark: an epoch metric recorded by the worker → received by WebSocket clients of the job.

Everything real and throwaway: a redis-server, a SQLite database in a temporary folder,
the ASGI app served as `make run` serves it (uvicorn, 2 worker processes; ``--server daphne``
for one daphne), N authenticated socket clients on one
job. The emitter calls ``apps.jobs.services.metrics_record`` (what the worker calls: DB
upsert, then ``group_send``); latency is from just before that call to each client's
receipt of the message. The baseline, measured in the same run, is one client.

    python bench/ws_latency.py [--clients 100] [--epochs 50] [--interval 0.1]

Target (issue 4): p95 ≤ 250 ms with 100 clients.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def setup_django(data_dir: Path, redis_url: str) -> None:
    os.environ.update({"DATA_DIR": str(data_dir), "REDIS_URL": redis_url, "LOG_LEVEL": "WARNING",
                       "DJANGO_SETTINGS_MODULE": "yoloportal.settings"})
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def make_job():
    from django.conf import settings

    from apps.accounts.services import membership_set, team_ensure, user_ensure
    from apps.datasets.demo import generate_demo_dataset
    from apps.datasets.services import dataset_register
    from apps.jobs.services import job_submit
    from apps.jobs.spec import parse_spec

    team = team_ensure(slug="vision")
    user = user_ensure(username="alice", password="pw")
    membership_set(user=user, team=team, role="manager")
    dataset_register(team=team, name="demo", yaml_path=generate_demo_dataset(settings.DATASETS_DIR / "demo"))
    spec = parse_spec({"task_name": "bench", "command": "yolo train data=demo model=yolov8n.yaml epochs=1000"})
    job, _ = job_submit(user=user, spec=spec)
    return user, job


def session_cookie(user) -> str:
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_web(port: int, log: Path, server: str = "uvicorn", workers: int = 2) -> subprocess.Popen:
    """The ASGI app as ``make run`` serves it (uvicorn, ``workers`` processes), or one daphne."""
    if server == "uvicorn":
        argv = [sys.executable, "-m", "uvicorn", "yoloportal.asgi:application", "--host", "127.0.0.1",
                "--port", str(port), "--workers", str(workers), "--no-access-log"]
    else:
        argv = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "yoloportal.asgi:application"]
    process = subprocess.Popen(argv, cwd=ROOT, env=dict(os.environ), stdout=log.open("ab"),
                               stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                time.sleep(2 if server == "uvicorn" else 0)  # every worker process up
                return process
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{server} did not start: {log.read_text()[-2000:]}")


# --- socket clients -----------------------------------------------------------------------------
# A minimal RFC 6455 reader on asyncio streams: autobahn's asyncio flavour cannot load once
# Django has imported daphne (txaio is then bound to Twisted), and the project has no other
# WebSocket client. The server's frames are unmasked text frames; that is all it reads.


async def ws_connect(port: int, path: str, cookie: str):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write((f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                  f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                  f"Origin: http://127.0.0.1:{port}\r\nCookie: sessionid={cookie}\r\n\r\n").encode())
    await writer.drain()
    status = await reader.readuntil(b"\r\n\r\n")
    if b" 101 " not in status.split(b"\r\n", 1)[0]:
        raise RuntimeError(f"handshake refused: {status[:200]!r}")
    return reader, writer


async def ws_messages(reader):
    """Yield decoded JSON text messages until the connection closes."""
    while True:
        head = await reader.readexactly(2)
        opcode, length = head[0] & 0x0F, head[1] & 0x7F
        if length == 126:
            length = struct.unpack("!H", await reader.readexactly(2))[0]
        elif length == 127:
            length = struct.unpack("!Q", await reader.readexactly(8))[0]
        payload = await reader.readexactly(length)
        if opcode == 0x8:
            return
        if opcode == 0x1:
            yield json.loads(payload)


async def open_clients(port: int, job_id: str, cookie: str, count: int, on_metric) -> list:
    loop = asyncio.get_running_loop()
    writers, ready, tasks = [], [], []

    async def client(reader, history_done):
        async for message in ws_messages(reader):
            received = time.time()
            if message.get("history_end"):
                history_done.set_result(True)
            elif message.get("type") == "metrics":
                on_metric(message["data"]["epoch"], received)

    for _ in range(count):
        reader, writer = await ws_connect(port, f"/ws/jobs/{job_id}/", cookie)
        history_done = loop.create_future()
        writers.append(writer)
        ready.append(history_done)
        tasks.append(asyncio.create_task(client(reader, history_done)))
    await asyncio.wait_for(asyncio.gather(*ready), timeout=60)
    return writers + tasks


async def measure(port: int, job, cookie: str, clients: int, epochs: int, interval: float, first_epoch: int) -> list[float]:
    from apps.jobs.services import metrics_record

    sent: dict[int, float] = {}
    latencies: list[float] = []
    expected = clients * epochs

    def on_metric(epoch: int, received: float) -> None:
        if epoch in sent:
            latencies.append((received - sent[epoch]) * 1000)

    transports = await open_clients(port, str(job.pk), cookie, clients, on_metric)

    def emit(epoch: int) -> None:
        sent[epoch] = time.time()
        metrics_record(job, epoch=epoch, values={"train/box_loss": 1.0 / epoch, "metrics/mAP50(B)": 0.01 * epoch})

    for epoch in range(first_epoch, first_epoch + epochs):
        await asyncio.to_thread(emit, epoch)  # a worker thread, as the worker's own process would be
        await asyncio.sleep(interval)
    deadline = time.monotonic() + 10
    while len(latencies) < expected and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    for item in transports:
        item.cancel() if isinstance(item, asyncio.Task) else item.close()
    if len(latencies) < expected:
        print(f"  ! {expected - len(latencies)} of {expected} messages never arrived")
    return latencies


def summary(name: str, samples: list[float]) -> str:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return (f"{name:<22} n={len(ordered):>5}  median {statistics.median(ordered):7.1f} ms  "
            f"p95 {p95:7.1f} ms  max {ordered[-1]:7.1f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--epochs", type=int, default=50, help="metrics emitted per run")
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between metrics")
    parser.add_argument("--server", choices=["uvicorn", "daphne"], default="uvicorn")
    parser.add_argument("--web-workers", type=int, default=2)
    parser.add_argument("--json")
    args = parser.parse_args()

    from apps.core.redis_server import RedisServer

    with tempfile.TemporaryDirectory(prefix="ws-bench-") as folder:
        data_dir = Path(folder)
        redis = RedisServer(data_dir=data_dir / "redis").start()
        daphne = None
        try:
            setup_django(data_dir, redis.url)
            user, job = make_job()
            cookie = session_cookie(user)
            port = free_port()
            daphne = start_web(port, data_dir / "web.log", args.server, args.web_workers)
            print(f"{args.server} on :{port}, job {job.pk}; {args.epochs} epoch metrics every {args.interval:g} s")
            baseline = asyncio.run(measure(port, job, cookie, 1, args.epochs, args.interval, first_epoch=1))
            loaded = asyncio.run(measure(port, job, cookie, args.clients, args.epochs, args.interval,
                                         first_epoch=args.epochs + 1))
            print(summary("baseline: 1 client", baseline))
            print(summary(f"{args.clients} clients", loaded))
            ordered = sorted(loaded)
            p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
            print(f"target p95 ≤ 250 ms with 100 clients: {'met' if p95 <= 250 else 'NOT met'}")
            if args.json:
                Path(args.json).write_text(json.dumps({
                    "server": args.server, "web_workers": args.web_workers, "clients": args.clients,
                    "epochs": args.epochs, "received": len(loaded), "expected": args.clients * args.epochs,
                    "median_ms": round(statistics.median(loaded), 1), "p95_ms": round(p95, 1),
                    "baseline_one_client": {"median_ms": round(statistics.median(baseline), 1),
                                            "p95_ms": round(sorted(baseline)[int(0.95 * len(baseline))], 1)},
                }, indent=2))
        finally:
            if daphne is not None:
                os.killpg(daphne.pid, signal.SIGTERM)
                try:
                    daphne.wait(20)
                except subprocess.TimeoutExpired:  # still closing its sockets gracefully
                    os.killpg(daphne.pid, signal.SIGKILL)
                    daphne.wait()
            redis.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
