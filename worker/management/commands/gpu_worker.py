"""manage.py gpu_worker: register this node's GPUs, heartbeat, and run what the scheduler sends.

Process tree of one node::

    gpu_worker (registers the node, heartbeats into the database, restarts slots)
    ├── zygote (torch + Ultralytics preloaded; forks training children)   [unless TRAINER_PRELOAD=false]
    └── slot 0..N-1: RQ Worker on queue node.<name>  (one job at a time each)
        └── work-horse (worker.tasks.run_attempt) ── training child (own process group)

Every process below gpu_worker dies with its parent (PR_SET_PDEATHSIG), so a killed
worker leaves nothing training on a GPU the scheduler will hand out again.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import redis
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connections
from rq import Worker

from apps.cluster.models import Node, node_name_problem
from apps.cluster.services import node_stopped, node_stopping
from apps.core.migrated import wait_until_migrated
from apps.core.redis_outage import OutageTolerantWorker, redis_outage_consequence, redis_unreachable
from apps.jobs.spec import parse_memory_mb
from apps.scheduling.dispatch import node_queue
from apps.scheduling.kick import kick_scheduler
from worker.artifacts import abandoned_run_folders_remove, shared_storage_problem
from worker.cache import cache_prune
from worker.inventory import detect
from worker.node import Heartbeat, register_this_host
from worker.tasks import set_parent_death_signal, trainer_environment
from yoloportal.logs import bind

log = logging.getLogger("yoloportal.worker")
STOP_GRACE_S = 3
LEAVE_TIMEOUT_S = 10  # for the heartbeat thread to finish a beat before the node is marked stopped


class NodeWorker(OutageTolerantWorker, Worker):
    """RQ's forking worker; a Redis outage is one line and does not leave a running work-horse."""


def zygote_address(node: str, worker_pid: int) -> str:
    """The abstract socket (``@…``, see worker/zygote.py) of the zygote this worker starts."""
    return f"@yoloportal-zygote-{node}-{worker_pid}"


class Command(BaseCommand):
    help = "Run the GPU worker for this node (RQ workers on the queue node.<name>)."

    def add_arguments(self, parser):
        parser.add_argument("--name", default=os.environ.get("NODE_NAME") or socket.gethostname().split(".")[0])
        parser.add_argument("--simulate-gpus", type=int, default=None, metavar="K",
                            help="register K simulated GPUs (training runs on CPU) instead of detecting GPUs")
        parser.add_argument("--cpus", type=int, default=None, metavar="N",
                            help="CPUs this node advertises to the scheduler (default: the machine's); more than "
                                 "the machine has is an explicit overcommit")
        parser.add_argument("--memory", default=None, metavar="QUANTITY",
                            help="memory this node advertises, e.g. 32Gi (default: the machine's)")
        parser.add_argument("--features", default=None, metavar="LIST",
                            help="comma-separated features it advertises, e.g. tensorrt (default: detected)")
        parser.add_argument("--slots", type=int, default=None,
                            help="jobs this node runs at once (default 4 per GPU, enough for 0.25-GPU jobs)")

    def handle(self, *args, name: str, simulate_gpus: int | None, slots: int | None, cpus: int | None = None,
               memory: str | None = None, features: str | None = None, **options):
        if simulate_gpus is not None and not 1 <= simulate_gpus <= 64:
            raise CommandError("--simulate-gpus must be between 1 and 64")
        if slots is not None and not 1 <= slots <= 256:
            raise CommandError("--slots must be between 1 and 256")
        if problem := node_name_problem(name):
            raise CommandError(f"--name (or NODE_NAME) {problem}")  # optrial24, F13: 'bad name!' registered
        name = name.lower().replace("_", "-")
        bind(component="worker", node=name)  # inherited by the slots and work-horses forked below
        redis_outage_consequence("training goes on")
        os.environ["YOLOPORTAL_NODE"] = name
        gpus = detect(simulate_gpus)
        if cpus is not None and not 1 <= cpus <= 4096:
            raise CommandError("--cpus must be between 1 and 4096")
        try:
            memory_mb = parse_memory_mb(memory) if memory is not None else None
        except ValueError as exc:
            raise CommandError(f"--memory {exc}") from None
        def register() -> Node:
            return register_this_host(name=name, gpus=gpus, cpus=cpus, memory_mb=memory_mb,
                                      executor=settings.WORKER_EXECUTOR,
                                      features=[f.strip() for f in features.split(",") if f.strip()]
                                      if features is not None else None)

        wait_until_migrated(log=log)  # started before `manage.py migrate`: one line a minute, not a traceback
        if problem := shared_storage_problem():  # before it registers: a node that would fail every job
            raise CommandError(f"node {name} not started: {problem}")
        node = register()
        if node.cpu_count > node.host_cpu_count or node.memory_mb > node.host_memory_mb:
            self.stdout.write(self.style.WARNING(
                f"node {name} advertises {node.cpu_count} CPUs / {node.memory_mb} MiB; the machine has "
                f"{node.host_cpu_count} / {node.host_memory_mb} MiB (overcommitted on purpose)"))
        if settings.ATTEMPT_CGROUPS:
            from worker.executors.local import host_cgroups

            host_cgroups().sweep()  # empty attempt cgroups a killed worker left behind
        abandoned_run_folders_remove()  # with an object store: attempts a killed worker left on this disk
        cache_prune()  # to ARTIFACTS_CACHE_MAX_GB: entries another worker's attempts hold stay
        self.stdout.write(f"node {name}: {node.limits_summary}; images {', '.join(node.images) or 'none'}")
        kind = "simulated (CPU)" if node.simulated else "NVIDIA"
        slots = slots or 4 * len(gpus)
        self.stdout.write(f"node {name}: {len(gpus)} {kind} GPU(s) ({', '.join(g.model for g in gpus[:4])}), "
                          f"{slots} job slots")
        zygote = self.start_zygote(name) if self.preload() else None
        # Slots are forked from this process: no DB connection may be shared across a fork.
        connections.close_all()
        self.stopping, self.node, self.draining = False, node, None
        children = {self.spawn_slot(name, i): i for i in range(slots)}
        # A node row deleted while this worker runs is registered again by the next beat; the
        # stop handlers read the node from here (the row it registered last).
        self.heartbeat = heartbeat = Heartbeat(node, settings.HEARTBEAT_S, simulated=node.simulated,
                                               register=register)
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        heartbeat.start()
        kick_scheduler()
        try:
            while children:
                try:
                    pid, _ = os.waitpid(-1, 0)
                except ChildProcessError:
                    break
                except InterruptedError:
                    continue
                # A reaped pid may be reused by any process: stop() must never signal it.
                self._slot_pids = [p for p in getattr(self, "_slot_pids", []) if p != pid]
                if pid in children and not self.stopping:
                    slot = children.pop(pid)
                    log.warning("slot %d (pid %d) exited; restarting it", slot, pid)
                    time.sleep(1)
                    if self.stopping:  # the stop signal came during the pause: no new slot
                        continue
                    children[self.spawn_slot(name, slot)] = slot
                elif zygote is not None and pid == zygote.pid and not self.stopping:
                    # Until it is back, children start a fresh interpreter (spawn falls back).
                    log.warning("the training zygote (pid %d) exited; restarting it", pid)
                    time.sleep(1)
                    zygote = self.start_zygote(name)
                else:
                    children.pop(pid, None)
        finally:
            heartbeat.stop()
            if zygote is not None:
                zygote.terminate()
            if self.stopping:
                self.leave(heartbeat.node, heartbeat)

    def leave(self, node, heartbeat: Heartbeat) -> None:
        """After a clean stop: say the node is gone and wake the scheduler.

        Without this the node counted as alive until NODE_GRACE_S (30 s) after its last
        heartbeat: the scheduler kept placing new jobs on it, and those, with the jobs its
        slots were running, waited for the lost-node reaper ("stopped reporting for 33 s")
        before running elsewhere — every rolling restart stranded work for the grace period.
        Marked lost now, the node gets no new work and the reaper requeues what it held in
        the pass this kick starts (each attempt once; apps.scheduling.loop.reap_lost_nodes).

        Only now: the slots (and with them their work-horses and trainings) have exited, so
        no attempt of this node still runs when it is requeued elsewhere; and the heartbeat
        thread has ended, so a last beat cannot revive the node after it is marked. If that
        thread or the database does not answer, nothing is marked: the grace period decides,
        as after a SIGKILL (which never gets here).
        """
        signal.alarm(0)  # every slot has exited: no SIGKILL round is due any more
        if self.draining is not None:
            self.draining.join(LEAVE_TIMEOUT_S)
        heartbeat.join(LEAVE_TIMEOUT_S)
        if heartbeat.is_alive():
            log.warning("node %s: the heartbeat thread did not stop within %d s; leaving the node to its "
                        "grace period", node.name, LEAVE_TIMEOUT_S)
            return
        try:
            marked = node_stopped(node, hostname=socket.gethostname(), worker_pid=os.getpid())
        except Exception as exc:  # noqa: BLE001 - the database may be why we stop
            log.warning("node %s: could not mark the node stopped (%s); its grace period will", node.name, exc)
            return
        finally:
            connections.close_all()
        if not marked:  # already lost, or a newer worker registered under this name
            self.stdout.write(f"node {node.name}: stopped; the node is not this worker's any more")
            return
        kick_scheduler()
        self.stdout.write(f"node {node.name}: stopped; marked lost, so what it held is requeued at once")

    def stop(self, signum, _frame) -> None:
        """Stop the node: SIGTERM to the slots (idle ones exit at once), SIGKILL after a grace.

        Jobs running here are not waited for (a training can take days): their process
        trees die with their slots, and once all slots have exited the node is marked lost
        (``leave``), so the scheduler requeues them from their checkpoints at once. Waiting
        would only make Ctrl-C hang. Meanwhile the node is marked stopping (``drain``), so
        nothing new is placed on it in those seconds.
        """
        first = not self.stopping
        self.stopping = True
        for pid in list(getattr(self, "_slot_pids", [])):
            try:
                os.kill(pid, signal.SIGTERM if first else signal.SIGKILL)
            except ProcessLookupError:
                pass
        if first:
            signal.signal(signal.SIGALRM, lambda *_: self.stop(signal.SIGKILL, None))
            signal.alarm(STOP_GRACE_S)
            if getattr(self, "heartbeat", None) is not None:
                # On a thread: a handler blocked on the database would hold up the SIGKILL round.
                self.draining = threading.Thread(target=self.drain, args=(self.heartbeat.node,), name="drain",
                                                 daemon=True)
                self.draining.start()

    def drain(self, node) -> None:
        """At the stop signal: the node takes no new work (``node_stopping``), and the scheduler is
        woken to plan without it. Before this, a pass in the seconds the slots take to exit could
        place a job here, which the reaper then took back once the node was lost."""
        try:
            marked = node_stopping(node, hostname=socket.gethostname(), worker_pid=os.getpid())
            if marked:
                kick_scheduler()
                self.stdout.write(f"node {node.name}: stopping; no new work is placed here")
        except Exception as exc:  # noqa: BLE001 - the database or Redis may be why we stop
            log.warning("node %s: could not mark the node stopping (%s); its slots exit anyway", node.name, exc)
        finally:
            connections.close_all()  # this thread's

    def spawn_slot(self, name: str, slot: int) -> int:
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                set_parent_death_signal()
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                self.work(name, slot)
            except BaseException:  # noqa: BLE001
                log.exception("slot %d crashed", slot)
                code = 1
            finally:
                os._exit(code)
        self._slot_pids = [*getattr(self, "_slot_pids", []), pid]
        return pid

    @staticmethod
    def preload() -> bool:
        # On CPU nodes and, since scripts/gpu_check.sh passed with it on an H200 (docs/gpu-check.md),
        # on NVIDIA nodes too: ``auto`` and ``true`` are the same today.
        return settings.TRAINER_PRELOAD in {"auto", "true", "1"}

    def start_zygote(self, name: str) -> subprocess.Popen:
        """Start the preloaded template process that forks training children (worker/zygote.py).

        Not waited for: until it listens, children start a fresh interpreter. Its socket is
        abstract (no file to leave behind when it or this worker is killed).
        """
        address = zygote_address(name, os.getpid())
        process = subprocess.Popen(
            [sys.executable, "-m", "worker.zygote", address, str(settings.DATA_DIR / "ultralytics-config")],
            cwd=str(settings.BASE_DIR), preexec_fn=set_parent_death_signal,
            env=trainer_environment(),  # children forked from it must not see the worker's secrets
        )
        os.environ["YOLOPORTAL_ZYGOTE"] = address
        return process

    def work(self, name: str, slot: int) -> None:
        """Run RQ's forking worker on our single queue (BLMOVE delivery); restart it if it dies."""
        while True:
            try:
                worker = NodeWorker([node_queue(name)], connection=redis.Redis.from_url(settings.REDIS_URL),
                                    name=f"{name}.{slot}.{os.getpid()}.{int(time.time())}")
                worker.work(with_scheduler=False, logging_level=settings.LOGGING["root"]["level"])
                return  # a clean stop (SIGINT/SIGTERM)
            except redis.RedisError as exc:  # registering or leaving: a new worker once Redis answers
                redis_unreachable(exc)
                time.sleep(2)
