"""Fault injection against the live system: real Redis, scheduler, workers and training.

Each test checks the invariants: no job lost, no GPU given twice, no job left in a
non-final state, no job training twice at once, metrics continuous (each epoch once).
Timings (kill → requeue → training resumed, epochs lost) are appended to
test-artifacts/reliability.jsonl for docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.utils import timezone

from apps.cluster.models import Node
from apps.jobs.models import TERMINAL_STATES, Checkpoint, Job, JobEvent, JobState, MetricPoint
from tests.conftest import SEED_SPEC, api_client
from worker.executors.base import KILL_GRACE_S
from worker.management.commands.gpu_worker import zygote_address

from .live import InvariantWatch, fast_trainer, open_jobs, training_processes, wait_for

pytestmark = [pytest.mark.faults, pytest.mark.integration, pytest.mark.django_db(transaction=True)]
ARTIFACTS = Path(settings.BASE_DIR) / "test-artifacts"


def submit(client, epochs: int, name: str = "fault", timeout: int = 3600, **extra) -> str:
    spec = SEED_SPEC.replace("epochs=2", f"epochs={epochs}").replace(
        "yolo-v8s-industrial-inspection", name).replace("timeout: 3600", f"timeout: {timeout}")
    for key, value in extra.items():
        spec += f"{key}: {value}\n"
    response = client.post("/api/v1/jobs/", spec, content_type="application/yaml")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def job(job_id) -> Job:
    return Job.objects.get(pk=job_id)


def finished(job_id) -> bool:
    return job(job_id).state in TERMINAL_STATES


def event_times(job_id, kind: str) -> list[float]:
    return [e.created_at.timestamp() for e in JobEvent.objects.filter(job_id=job_id, kind=kind)]


def assert_metrics_continuous(job_id, epochs: int) -> None:
    stored = list(MetricPoint.objects.filter(job_id=job_id).values_list("epoch", flat=True))
    assert sorted(stored) == list(range(1, epochs + 1)), stored


def assert_trained_once_per_attempt(job_id) -> None:
    attempts = list(JobEvent.objects.filter(job_id=job_id, kind="running").values_list("attempt", flat=True))
    assert len(attempts) == len(set(attempts)), f"an attempt ran twice: {attempts}"


# Infrastructure faults must not spend a job's retries: the jobs under them may retry twice.
RETRIES = 2


def assert_one_fault_one_attempt(job_id, faults: int) -> None:
    """``faults`` infrastructure faults cost exactly that many extra attempts and no retry."""
    final = job(job_id)
    ran = list(JobEvent.objects.filter(job_id=job_id, kind="running").order_by("seq").values_list("attempt", flat=True))
    timeline = list(JobEvent.objects.filter(job_id=job_id).order_by("seq").values_list("attempt", "kind"))
    assert final.attempt == 1 + faults and ran == list(range(1, 2 + faults)), timeline
    assert final.retries_left == RETRIES, f"an infrastructure fault spent a retry: {timeline}"
    assert not JobEvent.objects.filter(job_id=job_id, kind="retry").exists(), timeline


def record(fault: str, **figures) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    with open(ARTIFACTS / "reliability.jsonl", "a") as f:
        f.write(json.dumps({"fault": fault, **figures}) + "\n")


def resumed_from_epoch(job_id, attempt: int) -> int:
    started = JobEvent.objects.filter(job_id=job_id, kind="training_started", attempt=attempt).first()
    assert started is not None, f"attempt {attempt} never started training"
    return int(started.data["start_epoch"])


@pytest.mark.one_database
def test_it_resumes_from_the_checkpoint_after_the_training_process_is_killed(live, alice):
    """1. SIGKILL the training process mid-epoch."""
    live.start_scheduler()
    live.start_worker()
    job_id = submit(api_client(alice), epochs=4, retries=RETRIES)
    with InvariantWatch() as watch:
        wait_for(lambda: Checkpoint.objects.filter(job_id=job_id).exists(), 180, what="a first checkpoint")
        pids = training_processes()[job_id]
        killed_at = time.time()
        os.kill(pids[0], signal.SIGKILL)
        wait_for(lambda: finished(job_id), 240, what="the job to finish")
    final = job(job_id)
    assert final.state == JobState.SUCCEEDED, final.error
    assert_one_fault_one_attempt(job_id, faults=1)
    assert resumed_from_epoch(job_id, 2) >= 2
    assert_metrics_continuous(job_id, 4)
    assert_trained_once_per_attempt(job_id)
    assert not watch.violations, watch.violations
    requeued = event_times(job_id, "requeued")[0]
    resumed = JobEvent.objects.get(job_id=job_id, kind="training_started", attempt=2).created_at.timestamp()
    record("training process SIGKILL", kill_to_requeue_s=round(requeued - killed_at, 2),
           requeue_to_resume_s=round(resumed - requeued, 2),
           epochs_lost=0 if resumed_from_epoch(job_id, 2) > 1 else 1)


def test_it_requeues_a_dead_nodes_job_and_another_worker_finishes_it(live, alice):
    """2. SIGKILL the whole worker (parent, work-horse and, through PDEATHSIG, training)."""
    live.start_scheduler()
    live.start_worker()
    job_id = submit(api_client(alice), epochs=4, retries=RETRIES)
    with InvariantWatch() as watch:
        wait_for(lambda: Checkpoint.objects.filter(job_id=job_id).exists(), 180, what="a first checkpoint")
        epochs_before = job(job_id).epochs_done
        # Seen alive first: otherwise the wait below for it to die passes however it goes.
        assert training_processes().get(job_id), "the job's training was not found"
        killed_at = time.time()
        live.kill("worker")
        wait_for(lambda: not training_processes().get(job_id), 10, what="the orphaned training to die")
        grace = float(live.env()["NODE_GRACE_S"])
        wait_for(lambda: Node.objects.get(name="node-a").state == Node.State.LOST, grace + 10,
                 what="the node to be marked lost")
        lost_at = time.time()
        wait_for(lambda: job(job_id).state == JobState.QUEUED or job(job_id).attempt == 2, 10,
                 what="the job to be requeued")
        live.start_worker("worker2", node="node-b")
        wait_for(lambda: finished(job_id), 240, what="the job to finish on node-b")
    final = job(job_id)
    assert final.state == JobState.SUCCEEDED, final.error
    assert final.node.name == "node-b"
    assert_one_fault_one_attempt(job_id, faults=1)
    start_epoch = resumed_from_epoch(job_id, 2)
    assert start_epoch >= 2
    assert_metrics_continuous(job_id, 4)
    assert_trained_once_per_attempt(job_id)
    assert not watch.violations, watch.violations
    requeued = event_times(job_id, "node_lost")[0]
    resumed = JobEvent.objects.get(job_id=job_id, kind="training_started", attempt=2).created_at.timestamp()
    record("worker SIGKILL (node lost)", kill_to_lost_s=round(lost_at - killed_at, 2),
           kill_to_requeue_s=round(requeued - killed_at, 2), requeue_to_resume_s=round(resumed - requeued, 2),
           epochs_lost=max(0, epochs_before + 1 - start_epoch))


@pytest.mark.one_database
def test_it_survives_redis_being_killed_and_restarted(live, alice, redis_server):
    """3a. SIGKILL Redis mid-training and bring it back (AOF): nothing lost, nothing run twice."""
    live.start_scheduler()
    live.start_worker()
    client = api_client(alice)
    first = submit(client, epochs=3, name="redis-kill-a", retries=RETRIES)
    second = submit(client, epochs=2, name="redis-kill-b", retries=RETRIES)
    with InvariantWatch() as watch:
        wait_for(lambda: job(first).epochs_done >= 1, 180, what="the first job to train")
        killed_at = time.time()
        redis_server.kill()
        time.sleep(3)
        redis_server.start()
        wait_for(lambda: finished(first) and finished(second), 300, what="both jobs to finish")
    for job_id, epochs in ((first, 3), (second, 2)):
        final = job(job_id)
        assert final.state == JobState.SUCCEEDED, final.error
        assert final.attempt == 1, "a Redis restart must not restart training"
        assert_one_fault_one_attempt(job_id, faults=0)
        assert_metrics_continuous(job_id, epochs)
        assert_trained_once_per_attempt(job_id)
    assert not watch.violations, watch.violations
    started_second = event_times(second, "running")[0]
    record("Redis SIGKILL + restart", restart_to_next_dispatch_s=round(started_second - killed_at - 3, 2),
           epochs_lost=0)


def test_it_redelivers_jobs_after_redis_is_flushed(live, alice, redis_server):
    """3b. FLUSHALL while a job sits in its node's RQ queue: repair re-enqueues it within 60 s."""
    # A long node grace and suspicion: the node stays schedulable while its worker is briefly away.
    live.start_scheduler(NODE_GRACE_S="60", NODE_SUSPECT_S="60")
    live.start_worker()
    wait_for(lambda: Node.objects.filter(name="node-a").exists(), 60, what="the node to register")
    live.kill("worker")
    job_id = submit(api_client(alice), epochs=1, name="flushed", retries=RETRIES)
    wait_for(lambda: job(job_id).state == JobState.STARTING and job(job_id).dispatched_at, 30,
             what="the job to be dispatched into Redis")
    flushed_at = time.time()
    redis.Redis.from_url(redis_server.url).flushall()
    live.start_worker("worker2")
    with InvariantWatch() as watch:
        wait_for(lambda: job(job_id).state != JobState.STARTING, 60, what="the job to be re-delivered")
        wait_for(lambda: finished(job_id), 180, what="the job to finish")
    final = job(job_id)
    assert final.state == JobState.SUCCEEDED, final.error
    assert final.attempt == 1
    assert_one_fault_one_attempt(job_id, faults=0)
    assert JobEvent.objects.filter(job_id=job_id, kind="redispatched").exists()
    assert_trained_once_per_attempt(job_id)
    assert not watch.violations, watch.violations
    record("Redis FLUSHALL", flush_to_running_s=round(event_times(job_id, "running")[0] - flushed_at, 2),
           epochs_lost=0)


def test_it_repairs_an_allocation_the_scheduler_died_before_enqueueing(live, alice):
    """4. Kill the scheduler between allocation (committed) and enqueue."""
    live.start_worker()
    wait_for(lambda: Node.objects.filter(name="node-a").exists(), 60, what="the node to register")
    crashing = live.start_scheduler("crashing", YOLOPORTAL_FAULT="after_allocate")
    job_id = submit(api_client(alice), epochs=1, name="half-dispatched", retries=RETRIES)
    assert crashing.wait(60) == 17, live.log("crashing")[-2000:]
    stuck = job(job_id)
    assert stuck.state == JobState.STARTING and stuck.dispatched_at is None
    restarted_at = time.time()
    live.start_scheduler()
    with InvariantWatch() as watch:
        wait_for(lambda: finished(job_id), 180, what="the job to finish after the restart")
    final = job(job_id)
    assert final.state == JobState.SUCCEEDED, final.error
    assert final.attempt == 1
    assert_one_fault_one_attempt(job_id, faults=0)
    assert_trained_once_per_attempt(job_id)
    assert not watch.violations, watch.violations
    record("scheduler killed between allocate and enqueue",
           restart_to_running_s=round(event_times(job_id, "running")[0] - restarted_at, 2), epochs_lost=0)


@pytest.mark.one_database
def test_it_falls_back_to_the_previous_checkpoint_when_the_newest_is_truncated(live, alice):
    """5. A truncated checkpoint is refused; the attempt resumes from the one before."""
    live.start_scheduler()
    live.start_worker()
    job_id = submit(api_client(alice), epochs=8, retries=RETRIES)
    wait_for(lambda: Checkpoint.objects.filter(job_id=job_id).count() >= 2, 240, what="two checkpoints")
    # Seen alive first, so the wait for it to die is not vacuous: the file is truncated next.
    assert training_processes().get(job_id), "the job's training was not found"
    live.kill("worker")
    wait_for(lambda: not training_processes().get(job_id), 10, what="training to die with its worker")
    newest = Checkpoint.objects.filter(job_id=job_id).order_by("-epoch").first()
    with open(newest.path, "r+b") as f:
        f.truncate(newest.size // 3)
    with InvariantWatch() as watch:
        live.start_worker("worker2")
        wait_for(lambda: finished(job_id), 300, what="the job to finish")
    final = job(job_id)
    assert final.state == JobState.SUCCEEDED, final.error
    assert_one_fault_one_attempt(job_id, faults=1)  # the worker's death; the bad file costs no attempt
    rejected = JobEvent.objects.filter(job_id=job_id, kind="checkpoint_rejected")
    assert rejected.exists()
    assert resumed_from_epoch(job_id, final.attempt) == newest.epoch  # redoes the lost epoch
    assert_metrics_continuous(job_id, 8)
    assert not watch.violations, watch.violations
    record("newest checkpoint truncated", epochs_lost=1)


# 60 from 10 clients on either database (was 200, then 120, until CI's 45-minute budget ran
# out). FAULTS_SUBMISSIONS=500 for a heavier run. The jobs run the fast trainer
# (worker/fast_child.py: the real event contract and checkpoint files, no torch), as the
# two-scheduler stress test's do: this test is about submits, claims and a worker's death
# under concurrency; real training, killed and resumed, is what the other fault tests run.
# With Ultralytics it cost ~2.9 s of two cores a job on a slow machine.
SUBMISSIONS = int(os.environ.get("FAULTS_SUBMISSIONS", "60"))
# The longest a finished-job count may stand still: the worker kill (node lost after
# NODE_GRACE_S=8), the second worker's start and zygote preload, then one training, all on a
# loaded machine, take well under this. A lost job stops the count for good and fails here.
STALL_S = 300


def wait_for_all(count, total: int, stall_s: float, what: str, stuck=lambda: "") -> None:
    """Wait until ``count()`` reaches ``total``; fail once it has not grown for ``stall_s``,
    saying what ``stuck()`` describes (the jobs still open).

    The budget follows the machine's own pace instead of a fixed rate per job: beside
    `stress-ng --cpu 2` with others' load (load average 10-17 on 2 cores) the 200 jobs finished
    one every 5-8 s, and a fixed allowance is either short on a busier machine or slow to
    notice a lost job. What is asserted afterwards does not depend on how long it took.
    """
    done, last_change, started = count(), time.monotonic(), time.monotonic()
    while done < total:
        time.sleep(1.0)
        now_done = count()
        if now_done != done:
            done, last_change = now_done, time.monotonic()
        elif time.monotonic() - last_change > stall_s:
            raise AssertionError(f"{what}: {done} of {total} after {time.monotonic() - started:.0f} s, "
                                 f"none for {stall_s:.0f} s; {stuck()}")


# The jobs run two at a time (two simulated GPUs, a whole one each). Its wait is bounded by
# progress (STALL_S), so the suite-wide 600 s pytest-timeout is replaced by a hang guard far
# above any pace measured (30 s a job; 5-8 s a job was measured beside stress-ng at load 10-17).
@pytest.mark.timeout(300 + 30 * SUBMISSIONS)
def test_it_finishes_every_accepted_job_exactly_once_under_concurrent_submissions(live, teams, demo_registered):
    """6. Many concurrent submissions from 10 users while a worker is killed and restarted (fast trainer)."""
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connection

    from tests.conftest import make_user

    total = SUBMISSIONS
    users = [make_user(f"user{i}", teams["vision" if i % 2 else "robotics"]) for i in range(10)]
    clients = [api_client(u) for u in users]
    live.start_scheduler()
    live.start_worker(gpus=2, **fast_trainer(0.5))

    def submit_one(i: int):
        client = clients[i % len(clients)]
        spec = (SEED_SPEC.replace("epochs=2 imgsz=128", "epochs=1 imgsz=64 fraction=0.25")
                .replace("yolo-v8s-industrial-inspection", f"burst-{i}")
                .replace("user: vision\n", "") + "allow_duplicate: true\n")
        try:
            response = client.post("/api/v1/jobs/", spec, content_type="application/yaml",
                                   HTTP_IDEMPOTENCY_KEY=f"burst-{i}")
            return response.status_code, response.json().get("id")
        finally:
            connection.close()

    with InvariantWatch() as watch:
        with ThreadPoolExecutor(max_workers=10) as pool:
            results = list(pool.map(submit_one, range(total)))
        accepted = [job_id for status, job_id in results if status == 201]
        assert len(accepted) == total, [r for r in results if r[0] != 201][:5]
        wait_for(lambda: Job.objects.filter(state=JobState.RUNNING).exists(), 120, what="a job to run")
        live.kill("worker")
        time.sleep(2)
        live.start_worker("worker2", gpus=2, **fast_trainer(0.5))
        wait_for_all(lambda: Job.objects.filter(pk__in=accepted, state__in=TERMINAL_STATES).count(),
                     len(accepted), STALL_S, what="accepted jobs finished", stuck=lambda: open_jobs(accepted))
    states = Job.objects.filter(pk__in=accepted).values_list("state", flat=True)
    assert set(states) == {JobState.SUCCEEDED}, sorted(set(states))
    terminal_events = JobEvent.objects.filter(job_id__in=accepted, kind="succeeded").count()
    assert terminal_events == len(accepted), "each job finishes exactly once"
    for job_id in accepted:
        assert_trained_once_per_attempt(job_id)
    # One worker kill: each job lost at most the one attempt it was running then.
    attempts = dict(Job.objects.filter(pk__in=accepted).values_list("pk", "attempt"))
    assert max(attempts.values()) <= 2, sorted(attempts.values())[-5:]
    assert MetricPoint.objects.filter(job_id__in=accepted).count() == len(accepted)
    assert not watch.violations, watch.violations


@pytest.mark.one_database
def test_it_changes_nothing_when_a_worker_pauses_within_the_grace_period(live, alice):
    """A brief blip (SIGSTOP/SIGCONT of the whole worker for less than the grace) is not a loss."""
    # The pause is twice the suspicion (three missed heartbeats, 3 s here), so the node is
    # really suspected; the grace is 30 s (the default; the live tests' 8 s left ~3 s after a
    # 4 s pause), so a loaded machine has 24 s for the worker to wake and beat again.
    pause_s, suspect_s = 6.0, 3 * float(live.env()["HEARTBEAT_S"])
    live.start_scheduler(NODE_GRACE_S="30")
    worker = live.start_worker()
    job_id = submit(api_client(alice), epochs=4, retries=RETRIES)
    wait_for(lambda: job(job_id).epochs_done >= 1, 180, what="the first epoch")
    os.killpg(worker.pid, signal.SIGSTOP)
    time.sleep(pause_s)
    silent_s = (timezone.now() - Node.objects.get(name="node-a").last_heartbeat).total_seconds()
    os.killpg(worker.pid, signal.SIGCONT)
    assert silent_s > suspect_s, f"the paused worker still heartbeated ({silent_s:.1f} s silent): no blip was tested"
    wait_for(lambda: finished(job_id), 180, what="the job to finish")
    final = job(job_id)
    assert final.state == JobState.SUCCEEDED and final.attempt == 1
    assert_one_fault_one_attempt(job_id, faults=0)
    assert Node.objects.get(name="node-a").state == Node.State.ACTIVE
    assert not JobEvent.objects.filter(job_id=job_id, kind__in=["node_lost", "requeued"]).exists()


@pytest.mark.one_database
def test_it_times_out_a_job_and_stops_its_process_tree(live, alice, settings):
    """The job's own timeout ends it as timed_out within 10 s, GPUs freed, usage charged."""
    from apps.quotas.models import UsageRecord

    settings.MIN_TRAIN_TIMEOUT_S = 1  # a 12-second training: under the 60 s a submit asks for by default
    live.start_scheduler()
    live.start_worker()
    job_id = submit(api_client(alice), epochs=300, name="too-long", timeout=12)
    wait_for(lambda: job(job_id).state == JobState.RUNNING, 60, what="the job to run")
    # Its training seen alive (else the wait below for it to be gone proves nothing).
    wait_for(lambda: training_processes().get(job_id), 30, interval=0.1, what="the training process")
    wait_for(lambda: finished(job_id), 12 + 30, what="the timeout")
    final = job(job_id)
    assert final.state == JobState.TIMED_OUT and "timeout" in final.error
    # The timeout, the kill's grace (SIGTERM, then SIGKILL) and 10 s for a loaded machine: far
    # below the 300 epochs it asked for.
    assert (final.finished_at - final.started_at).total_seconds() <= 12 + KILL_GRACE_S + 10
    wait_for(lambda: not training_processes().get(job_id), 10, what="the process tree to be gone")
    # Charged in the same transaction as the timed_out state (attempt_finish): there already.
    assert UsageRecord.objects.get(job_id=job_id).gpu_seconds >= 10


@pytest.mark.one_database
def test_it_recovers_when_the_training_zygote_dies(live, alice):
    """SIGKILL the zygote that forks training children: the attempt is requeued and finishes."""
    live.start_scheduler()
    worker = live.start_worker()
    address = zygote_address("node-a", worker.pid)
    # Until the zygote has preloaded, children start a fresh interpreter instead.
    wait_for(lambda: "zygote ready" in live.log("worker"), 60, what="the zygote to preload")
    assert zygote_listener(address) in zygote_pids(), f"no zygote listens on {address}"
    job_id = submit(api_client(alice), epochs=4, name="zygote-dies", retries=RETRIES)
    with InvariantWatch() as watch:
        wait_for(lambda: Checkpoint.objects.filter(job_id=job_id).exists(), 180, what="a first checkpoint")
        zygotes = zygote_pids()
        assert zygotes, "simulated nodes train through the zygote"
        for pid in zygotes:
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: finished(job_id), 240, what="the job to finish")
        wait_for(lambda: zygote_pids(), 30, what="gpu_worker to restart the zygote")
    final = job(job_id)
    assert final.state == JobState.SUCCEEDED, final.error
    assert final.attempt == 2 and resumed_from_epoch(job_id, 2) >= 2
    assert_one_fault_one_attempt(job_id, faults=1)
    assert_metrics_continuous(job_id, 4)
    assert_trained_once_per_attempt(job_id)
    assert not watch.violations, watch.violations
    # The restarted zygote listens where the check below looks (else that check proves nothing).
    wait_for(lambda: zygote_listener(address) in zygote_pids(), 90, what=f"the new zygote to listen on {address}")
    assert bound(address), f"{address} is not in /proc/net/unix"
    live.kill("worker")  # SIGKILL, the whole group: nobody gets to clean up
    assert_no_zygote_socket(worker.pid, address)


def bound(address: str) -> list[str]:
    """The lines of /proc/net/unix for the abstract socket ``address`` (``@name``)."""
    return [line for line in Path("/proc/net/unix").read_text().splitlines() if line.endswith(f" {address}")]


def zygote_listener(address: str) -> int | None:
    """The pid of the process listening on ``address`` (``SO_PEERCRED``), None if none listens.
    A zygote turns this caller away (not one of its worker's processes) and only logs it."""
    import socket

    from worker import zygote

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(5)
        try:
            conn.connect(zygote.sockaddr(address))
        except ConnectionRefusedError:
            return None
        return zygote.peer(conn)[0]


def assert_no_zygote_socket(worker_pid: int, address: str) -> None:
    """The stopped worker's zygote left no socket behind: no file (it used to be one in the temp
    dir, left by every stop and kill) and, once the zygote is gone, no bound abstract socket."""
    import tempfile

    assert not list(Path(tempfile.gettempdir()).glob(f"yoloportal-zygote-*-{worker_pid}.sock"))
    wait_for(lambda: not bound(address), 10, what="the zygote's socket to go")


def zygote_pids() -> list[int]:
    pids = []
    # This test run's zygotes only: their config dir is our DATA_DIR's (gpu_worker.start_zygote).
    # The whole word, not a substring: var/test is in var/test/gw0's path (another session's).
    config_dir = str(settings.DATA_DIR / "ultralytics-config").encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                words = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"worker.zygote" in words and config_dir in words:
                pids.append(int(entry.name))
    return pids


def timeline_of(job_id) -> list[tuple[int, str]]:
    return list(JobEvent.objects.filter(job_id=job_id).order_by("seq").values_list("attempt", "kind"))


@pytest.mark.one_database
def test_an_exception_in_the_workers_own_code_ends_the_attempt_with_its_reason(live, alice):
    """7. Our code raises inside the RQ task (staging inputs did once): the attempt ends at once as a
    failure that names the exception (a retry, then failed), not as a lost worker requeued forever."""
    from apps.jobs.models import GpuSlot

    live.start_scheduler()
    live.start_worker(YOLOPORTAL_FAULT="staging:raise")
    job_id = submit(api_client(alice), epochs=1, name="worker-raises", retries=1)
    wait_for(lambda: finished(job_id), 180, what="the job to end")
    final, timeline = job(job_id), timeline_of(job_id)
    assert final.state == JobState.FAILED, timeline
    assert final.error == ("the worker on node-a could not run the attempt: "
                           "RuntimeError: fault injection: raised at staging"), final.error
    assert (final.attempt, final.retries_left) == (2, 0), timeline
    kinds = [kind for _, kind in timeline]
    assert kinds.count("retry") == 1 and "node_lost" not in kinds and "training_started" not in kinds, timeline
    assert not GpuSlot.objects.filter(job_id=job_id).exists()
    assert "the worker raised RuntimeError" in live.log("worker")  # the traceback stays in the worker's log


def test_a_job_whose_worker_dies_under_every_attempt_fails_after_max_lost_attempts(live, alice):
    """8. The work-horse dies without a word on every attempt (a poison job): each attempt is reaped
    as lost (not a retry) until MAX_LOST_ATTEMPTS of them are, then the job fails saying so."""
    live.start_scheduler(MAX_LOST_ATTEMPTS="3")
    live.start_worker(YOLOPORTAL_FAULT="staging")
    job_id = submit(api_client(alice), epochs=1, name="poison", retries=RETRIES)
    grace = float(live.env()["NODE_GRACE_S"])
    wait_for(lambda: finished(job_id), 3 * grace + 180, what="the job to end")
    final, timeline = job(job_id), timeline_of(job_id)
    assert final.state == JobState.FAILED, timeline
    assert final.error.startswith("3 attempts ended without their worker (MAX_LOST_ATTEMPTS=3); not requeued "
                                  "again. The last, attempt 3: attempt 3 stopped reporting on node-a for "), final.error
    assert final.retries_left == RETRIES, timeline  # lost attempts are not retries
    running = [attempt for attempt, kind in timeline if kind == "running"]
    assert final.attempt == 3 and running == [1, 2, 3], timeline
    lost = JobEvent.objects.filter(job_id=job_id, kind="node_lost")
    assert [e.data["attempt_started"] for e in lost] == [True, True], timeline
    assert Node.objects.get(name="node-a").state == Node.State.ACTIVE  # the worker itself lived




def running_on(job_id, node: str, attempt: int) -> bool:
    return JobEvent.objects.filter(job_id=job_id, kind="running", attempt=attempt,
                                   message__startswith=f"running on {node} ").exists()


# What it adds in SQL, the node's conditional update and the reaper's pass, is run on PostgreSQL
# by the unit tests in tests/cluster/test_services.py and tests/scheduling/test_one_fault_one_attempt.py.
@pytest.mark.one_database
def test_a_cleanly_stopped_worker_takes_no_new_work_and_its_job_moves_at_once(live, alice):
    """9. SIGTERM a worker (a rolling restart): its node is marked stopping at the signal (nothing new
    placed) and lost as it exits, so its running job is requeued at once (one attempt) and no new
    job is placed on it, long before NODE_GRACE_S.

    The grace and the suspicion are 60 s here: before the worker said it stopped, its running
    job waited those 60 s for the node-lost reaper, and new jobs could be placed on its free GPU.
    Lean: the jobs are only seen running on the other node (the live fixture kills them after)."""
    client = api_client(alice)

    def submit_tiny(name: str) -> str:
        spec = (SEED_SPEC.replace("epochs=2 imgsz=128", "epochs=50 imgsz=64 fraction=0.25")
                .replace("yolo-v8s-industrial-inspection", name) + f"retries: {RETRIES}\nallow_duplicate: true\n")
        response = client.post("/api/v1/jobs/", spec, content_type="application/yaml")
        assert response.status_code == 201, response.content
        return response.json()["id"]

    live.start_scheduler(NODE_GRACE_S="60", NODE_SUSPECT_S="60")
    worker = live.start_worker(node="node-a", gpus=2)  # a free GPU beside the running job
    moving = submit_tiny("rolling-moving")
    wait_for(lambda: job(moving).node_id is not None, 120, what="the job to be placed on node-a")
    assert job(moving).node.name == "node-a"
    live.start_worker("worker2", node="node-b", gpus=2)
    wait_for(lambda: running_on(moving, "node-a", 1), 120, what="the job to run on node-a")
    wait_for(lambda: Node.objects.filter(name="node-b").exists(), 60, what="node-b to register")
    wait_for(lambda: "zygote ready" in live.log("worker"), 60, what="node-a's zygote to listen")
    address = zygote_address("node-a", worker.pid)
    assert zygote_listener(address) in zygote_pids(), f"no zygote listens on {address}"

    worker.send_signal(signal.SIGTERM)  # the worker's own process only, as systemd or Kubernetes stop it
    states = ["active"]  # node-a's, while its busy slot takes its SIGKILL grace (~3 s) to exit
    deadline = time.monotonic() + 30
    while worker.poll() is None and time.monotonic() < deadline:
        if (state := Node.objects.get(name="node-a").state) != states[-1]:
            states.append(state)
        time.sleep(0.05)
    assert worker.wait(1) == 0, live.log("worker")[-3000:]
    stopped_at = time.time()
    assert "marked lost" in live.log("worker")
    assert states[:2] == ["active", "stopping"], states  # no new placements from the signal on
    new = submit_tiny("rolling-new")
    assert_no_zygote_socket(worker.pid, address)
    with InvariantWatch() as watch:
        wait_for(lambda: job(moving).attempt == 2, 15, what="the stopped node's job to be requeued")
        requeued_at = time.time()
        wait_for(lambda: running_on(moving, "node-b", 2) and running_on(new, "node-b", 1), 60,
                 what="both jobs to run on node-b")
    assert Node.objects.get(name="node-a").state == Node.State.LOST
    [lost] = JobEvent.objects.filter(job_id=moving, kind="node_lost")
    assert "the worker on node node-a stopped" in lost.message, lost.message
    assert_one_fault_one_attempt(moving, faults=1)
    assert_one_fault_one_attempt(new, faults=0)
    placed = list(JobEvent.objects.filter(job_id=new, kind="scheduled").values_list("message", flat=True))
    assert len(placed) == 1 and "placed on node-b" in placed[0], placed
    assert not watch.violations, watch.violations
    record("worker SIGTERM (clean stop)", stop_to_requeue_s=round(requeued_at - stopped_at, 2))


HOLD_WRITE_LOCK = """
import sqlite3, sys, time
connection = sqlite3.connect(sys.argv[1], isolation_level=None)
connection.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
connection.execute("COMMIT")
"""


@pytest.mark.one_database
def test_a_database_that_stops_answering_mid_training_is_ridden_out_without_losing_the_attempt(live, alice):
    """10. Another process holds SQLite's write lock past the busy timeout (30 s) while a job trains
    (a backup, an `sqlite3` shell, a stuck migration; on PostgreSQL a restart or a failover is the
    same OperationalError). That is no fault of the job: the work-horse waits for the database
    while the child trains on, then records what it reported meanwhile; the attempt goes on
    (fault32: it ended the job with "the worker on node-a could not run the attempt:
    OperationalError: database is locked", a retry spent, and the next attempt started over: the
    child's keep-3 retention had deleted the one checkpoint recorded).

    The node grace is longer than the outage: a longer outage also ends in the node's loss, whose
    requeue (one attempt, no retry) was already right."""
    import subprocess
    import sys

    live.start_scheduler(NODE_GRACE_S="120", NODE_SUSPECT_S="120")
    live.start_worker()
    job_id = submit(api_client(alice), epochs=30, name="database-outage", retries=RETRIES)
    wait_for(lambda: Checkpoint.objects.filter(job_id=job_id).exists(), 180, what="a first checkpoint")
    held = float(settings.DATABASES["default"]["OPTIONS"]["timeout"]) + 4
    holder = subprocess.Popen([sys.executable, "-c", HOLD_WRITE_LOCK, settings.DATABASES["default"]["NAME"], str(held)],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    assert holder.wait(held + 30) == 0
    wait_for(lambda: finished(job_id), 400, what="the job to end")
    final, timeline = job(job_id), timeline_of(job_id)
    assert final.state == JobState.SUCCEEDED, (final.error, timeline)
    assert_one_fault_one_attempt(job_id, faults=0)
    assert_metrics_continuous(job_id, 30)
    log = live.log("worker")
    assert "the database does not answer (OperationalError: database is locked); the training goes on" in log, log[-3000:]
    assert "the database answers again after" in log
