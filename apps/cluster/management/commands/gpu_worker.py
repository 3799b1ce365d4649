"""manage.py gpu_worker: register this node's GPUs, heartbeat, and run what the scheduler sends."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connections
from rq import Worker

from apps.scheduling.dispatch import node_queue
from apps.scheduling.kick import kick_scheduler, redis_client
from worker.inventory import detect
from worker.node import Heartbeat, node_register
from worker.tasks import set_parent_death_signal

log = logging.getLogger("yoloportal.worker")


class Command(BaseCommand):
    help = "Run the GPU worker for this node (one RQ worker on the queue node.<name>)."

    def add_arguments(self, parser):
        parser.add_argument("--name", default=os.environ.get("NODE_NAME") or socket.gethostname().split(".")[0])
        parser.add_argument("--simulate-gpus", type=int, default=None, metavar="K",
                            help="register K simulated GPUs (training runs on CPU) instead of detecting GPUs")

    def handle(self, *args, name: str, simulate_gpus: int | None, **options):
        if simulate_gpus is not None and not 1 <= simulate_gpus <= 64:
            raise CommandError("--simulate-gpus must be between 1 and 64")
        name = name.lower().replace("_", "-")
        os.environ["YOLOPORTAL_NODE"] = name
        gpus = detect(simulate_gpus)
        node = node_register(name=name, gpus=gpus)
        kind = "simulated (CPU)" if node.simulated else "NVIDIA"
        self.stdout.write(f"node {name}: {len(gpus)} {kind} GPU(s): " + ", ".join(g.model for g in gpus[:4]))
        zygote = self.start_zygote(name) if self.preload(node) else None
        heartbeat = Heartbeat(node, settings.HEARTBEAT_S, simulated=node.simulated)
        # RQ forks a work-horse per job: no open DB connection may be shared across that fork.
        connections.close_all()
        heartbeat.start()
        kick_scheduler()
        try:
            self.work(name)
        finally:
            heartbeat.stop()
            if zygote is not None:
                zygote.terminate()

    @staticmethod
    def preload(node) -> bool:
        if settings.TRAINER_PRELOAD in {"true", "1"}:
            return True
        return settings.TRAINER_PRELOAD == "auto" and node.simulated

    def start_zygote(self, name: str) -> subprocess.Popen | None:
        """Start the preloaded template process that forks training children (worker/zygote.py)."""
        path = Path(tempfile.gettempdir()) / f"yoloportal-zygote-{name}-{os.getpid()}.sock"
        process = subprocess.Popen(
            [sys.executable, "-m", "worker.zygote", str(path), str(settings.DATA_DIR / "ultralytics-config")],
            cwd=str(settings.BASE_DIR), preexec_fn=set_parent_death_signal,
        )
        deadline = time.monotonic() + 120
        while not path.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if not path.exists():
            log.warning("the training zygote did not start; children will start a fresh interpreter")
            process.kill()
            return None
        os.environ["YOLOPORTAL_ZYGOTE"] = str(path)
        return process

    def work(self, name: str) -> None:
        """Run RQ's forking worker on our single queue (BLMOVE delivery); restart it if it dies."""
        while True:
            try:
                worker = Worker([node_queue(name)], connection=redis_client(),
                                name=f"{name}.{os.getpid()}.{int(time.time())}")
                worker.work(with_scheduler=False, logging_level=settings.LOGGING["root"]["level"])
                return  # a clean stop (SIGINT/SIGTERM)
            except redis.RedisError as exc:
                log.warning("worker lost Redis (%s); reconnecting in 2 s", exc)
                time.sleep(2)
