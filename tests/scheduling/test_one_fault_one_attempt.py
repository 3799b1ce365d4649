"""One fault costs one attempt: the reapers, the worker's death report and placement, driven
in the orders a busy machine produces, against the real database (and Redis for dispatch).

The live versions are in tests/integration/test_faults.py. A whole-worker kill used to cost
two attempts when either the attempt's own silence or the work-horse's "training killed"
report requeued the job before the node was declared lost: the requeued attempt was placed
on the dying node (it still counted as alive), and the node's loss requeued it again.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from apps.cluster.models import Node
from apps.cluster.services import node_register, node_stopping
from apps.jobs.models import GpuSlot, Job, JobEvent, JobState
from apps.jobs.services import attempt_finish, attempt_lost, attempt_start, job_claim, job_requeue
from apps.quotas.models import UsageRecord
from apps.scheduling.loop import tick
from tests.jobs.factories import make_job
from worker.inventory import simulated_gpus

pytestmark = pytest.mark.django_db

S = timedelta(seconds=1)


@pytest.fixture(autouse=True)
def _fast_timings(settings):
    # As in the fault tests: a node silent 8 s is lost; 3 missed heartbeats make it suspected.
    settings.NODE_GRACE_S = 8.0
    settings.HEARTBEAT_S = 1.0
    settings.NODE_SUSPECT_S = 3.0


def register(name: str) -> Node:
    return node_register(name=name, gpus=simulated_gpus(1), cpu_count=8, memory_mb=32768,
                         hostname=f"host-{name}", worker_pid=1234)


@pytest.fixture
def running(alice, teams):
    """Attempt 1 training on node-a GPU 0, its monitor and its node both reporting now."""
    node = register("node-a")
    job = make_job(team=teams["vision"], user=alice, gpus=1, retries_left=2)
    assert job_claim(job, node=node, gpu_indices=[0], gpu_share=1.0, run_class="medium")
    job = attempt_start(job_id=job.pk, attempt_id=Job.objects.get(pk=job.pk).attempt_id, node_name="node-a")
    assert job is not None
    return job


def beats(job, *, node_at, attempt_at) -> None:
    Node.objects.filter(name="node-a").update(last_heartbeat=node_at)
    Job.objects.filter(pk=job.pk).update(heartbeat_at=attempt_at)


def current(job) -> Job:
    return Job.objects.select_related("node").get(pk=job.pk)


def kinds(job) -> list[str]:
    return list(JobEvent.objects.filter(job_id=job.pk).order_by("seq").values_list("kind", flat=True))


def slots(job) -> set[tuple]:
    """The GPU slots the job's rows hold: (node, GPU, attempt_id)."""
    return set(GpuSlot.objects.filter(job_id=job.pk).values_list("node__name", "gpu_index", "attempt_id"))


def finish_on_node_b(job) -> Job:
    """Another node arrives; the job runs there as the attempt it is."""
    register("node-b")
    tick()
    placed = current(job)
    assert placed.state == JobState.STARTING and placed.node.name == "node-b"
    assert slots(job) == {("node-b", 0, placed.attempt_id)}  # nothing left behind on node-a
    return attempt_start(job_id=placed.pk, attempt_id=placed.attempt_id, node_name="node-b")


def test_a_worker_killed_while_its_attempt_lagged_costs_one_attempt(running):
    """The attempt's last heartbeat is 2 s older than its node's (a starved monitor) when the
    whole worker dies. The attempt passes the grace first; it is the node's loss that ends it."""
    killed = timezone.now()
    beats(running, node_at=killed, attempt_at=killed - 2 * S)

    tick(killed + 7 * S)  # attempt silent 9 s, node silent 7 s: suspected, not lost yet
    job = current(running)
    assert (job.state, job.attempt) == (JobState.RUNNING, 1), "reaped before its node was declared lost"

    tick(killed + 9 * S)  # the node's grace ends
    job = current(running)
    assert Node.objects.get(name="node-a").state == Node.State.LOST
    assert (job.state, job.attempt, job.node, job.retries_left) == (JobState.QUEUED, 2, None, 2)
    assert kinds(job).count("node_lost") == 1
    assert slots(job) == set()

    second = finish_on_node_b(running)
    assert second is not None and second.attempt == 2


def test_a_training_death_reported_before_the_node_died_costs_one_attempt(running):
    """The work-horse sees its training killed (the zygote died with the worker) and reports it
    before its own death; the job is placed on the node again, which then turns out dead."""
    killed = timezone.now()
    beats(running, node_at=killed, attempt_at=killed)
    assert attempt_finish(running, outcome="killed", exit_code=-9, error="killed by signal 9") == "requeued"

    tick(killed + S / 2)  # the node still reports on time: the job is placed on it again
    placed = current(running)
    assert (placed.state, placed.node.name, placed.attempt) == (JobState.STARTING, "node-a", 2)
    assert slots(placed) == {("node-a", 0, placed.attempt_id)}

    tick(killed + 9 * S)  # node-a's grace ends before it ever picked the attempt up
    job = current(running)
    assert (job.state, job.attempt, job.node, job.retries_left) == (JobState.QUEUED, 2, None, 2)
    assert job.attempt_id != placed.attempt_id
    assert slots(job) == set()  # the never-started placement's slots are freed with it
    event = JobEvent.objects.filter(job_id=job.pk).order_by("-seq").first()
    assert event.kind == "node_lost" and "attempt 2 had not started" in event.message

    second = finish_on_node_b(running)
    assert second is not None and second.attempt == 2
    # The delivery still waiting in node-a's queue is fenced off if node-a comes back.
    assert attempt_start(job_id=job.pk, attempt_id=placed.attempt_id, node_name="node-a") is None


def test_a_training_stopped_with_its_worker_says_so_not_killed_by_signal_9(running):
    """Ctrl-C / systemctl stop: the worker marks its node stopping, then its trainings die (SIGKILL
    after the grace). The requeue said "training process was killed by signal 9", which a user
    reads as an out-of-memory kill (trial 16, G7); a kill on a node not stopping still says that."""
    assert node_stopping(Node.objects.get(name="node-a"), hostname="host-node-a", worker_pid=1234)
    assert attempt_finish(running, outcome="killed", exit_code=-9, error="killed by signal 9") == "requeued"
    said = JobEvent.objects.filter(job_id=running.pk, kind="requeued").values_list("message", flat=True).get()
    assert said.startswith("its worker on node node-a was stopped (the node is shutting down); requeued to resume")
    assert "signal" not in said


def test_a_suspected_node_gets_no_new_work_until_it_reports_again(alice, teams):
    register("node-a")
    job = make_job(team=teams["vision"], user=alice, gpus=1)
    now = timezone.now()
    Node.objects.filter(name="node-a").update(last_heartbeat=now - 4 * S)  # 4 missed beats, grace 8 s
    tick(now)
    assert current(job).state == JobState.QUEUED
    Node.objects.filter(name="node-a").update(last_heartbeat=now)
    tick(now)
    assert (current(job).state, current(job).node.name) == (JobState.STARTING, "node-a")


def test_a_silent_attempt_on_a_reporting_node_is_still_reaped(running):
    """The work-horse died but its worker lives: the attempt's own silence ends it."""
    now = timezone.now()
    beats(running, node_at=now, attempt_at=now - 9 * S)
    tick(now)
    job = current(running)
    assert job.attempt == 2 and job.retries_left == 2
    assert kinds(job).count("node_lost") == 1
    assert job.state == JobState.STARTING and job.node.name == "node-a"  # placed again: the node is fine
    assert slots(job) == {("node-a", 0, job.attempt_id)}  # attempt 1's slots were freed


def test_a_running_attempt_left_on_a_lost_node_is_reaped(running):
    """Nothing stays running on a node already declared lost (a scheduler died mid-reap)."""
    now = timezone.now()
    Node.objects.filter(name="node-a").update(state=Node.State.LOST)
    beats(running, node_at=now - 60 * S, attempt_at=now - 60 * S)
    tick(now)
    job = current(running)
    assert (job.state, job.attempt) == (JobState.QUEUED, 2)
    assert slots(job) == set()


def test_requeueing_a_placement_that_never_started_keeps_its_attempt_number(alice, teams):
    node = register("node-a")
    job = make_job(team=teams["vision"], user=alice, gpus=1)
    assert job_claim(job, node=node, gpu_indices=[0], gpu_share=1.0, run_class="medium")
    delivered = current(job).attempt_id  # what the node's queue holds
    assert job_requeue(current(job), reason="node-a stopped reporting")
    job = current(job)
    assert (job.state, job.attempt) == (JobState.QUEUED, 1) and job.attempt_id != delivered
    assert slots(job) == set()
    assert attempt_start(job_id=job.pk, attempt_id=delivered, node_name="node-a") is None


def test_a_requeue_racing_the_fenced_start_counts_the_attempt_the_start_won(alice, teams):
    """The number is decided in the requeue's own conditional update, from the row as it is then."""
    node = register("node-a")
    job = make_job(team=teams["vision"], user=alice, gpus=1)
    assert job_claim(job, node=node, gpu_indices=[0], gpu_share=1.0, run_class="medium")
    seen_starting = current(job)
    assert attempt_start(job_id=job.pk, attempt_id=seen_starting.attempt_id, node_name="node-a")
    assert job_requeue(seen_starting, reason="reaped")
    assert current(job).attempt == 2


def started_after_the_reaper_read_it(alice, teams) -> tuple[Job, Job]:
    """A placement on node-a as the reaper read it (``starting``), and the job after its worker's
    fenced start won meanwhile (``running``): the window between the reaper's read and its update."""
    node = register("node-a")
    job = make_job(team=teams["vision"], user=alice, gpus=1)
    assert job_claim(job, node=node, gpu_indices=[0], gpu_share=1.0, run_class="medium")
    seen_starting = current(job)
    assert attempt_start(job_id=job.pk, attempt_id=seen_starting.attempt_id, node_name="node-a")
    return seen_starting, current(job)


def test_a_lost_placement_that_started_after_the_reaper_read_it_is_charged(alice, teams):
    """Chaos run (bench/chaos.py): attempt 1 ran, was reaped with its node, and was never charged."""
    seen_starting, started = started_after_the_reaper_read_it(alice, teams)
    ended = started.started_at + 9 * S
    assert attempt_lost(seen_starting, reason="node node-a stopped reporting for 9 s", now=ended) == "requeued"
    assert current(started).attempt == 2
    [charged] = UsageRecord.objects.filter(job_id=started.pk)
    assert (charged.attempt, charged.gpu_seconds) == (1, pytest.approx(9.0))


def test_a_lost_placement_that_started_after_the_reaper_read_it_counts_toward_max_lost(alice, teams, settings):
    settings.MAX_LOST_ATTEMPTS = 1
    seen_starting, started = started_after_the_reaper_read_it(alice, teams)
    assert attempt_lost(seen_starting, reason="node node-a stopped reporting", now=timezone.now()) == "failed"
    assert current(started).state == JobState.FAILED
    assert UsageRecord.objects.filter(job_id=started.pk, attempt=1).exists()


def test_a_start_cut_short_before_its_event_leaves_the_placement_starting(alice, teams, monkeypatch):
    """Chaos run: a work-horse killed between the fenced start and its "running" event left an
    attempt that ran and was charged with no "running" in its timeline."""
    node = register("node-a")
    job = make_job(team=teams["vision"], user=alice, gpus=1)
    assert job_claim(job, node=node, gpu_indices=[0], gpu_share=1.0, run_class="medium")
    monkeypatch.setenv("YOLOPORTAL_FAULT", "attempt_start:raise")
    with pytest.raises(RuntimeError, match="fault injection"):
        attempt_start(job_id=job.pk, attempt_id=current(job).attempt_id, node_name="node-a")
    assert (current(job).state, current(job).started_at) == (JobState.STARTING, None)
    assert "running" not in kinds(job)


def test_a_requeue_cut_short_before_its_event_is_not_half_done(running, monkeypatch):
    """attempt_lost counts node_lost events: a requeue that committed without its event was a lost
    attempt MAX_LOST_ATTEMPTS never counted."""
    monkeypatch.setenv("YOLOPORTAL_FAULT", "job_requeue:raise")
    with pytest.raises(RuntimeError, match="fault injection"):
        attempt_lost(running, reason="node node-a stopped reporting", now=timezone.now())
    job = current(running)
    assert (job.state, job.attempt, job.attempt_id) == (JobState.RUNNING, 1, running.attempt_id)
    assert slots(job) == {("node-a", 0, running.attempt_id)}
    assert not UsageRecord.objects.filter(job_id=job.pk).exists()


def test_a_horse_sees_its_worker_die():
    """worker.tasks.worker_died: the work-horse notices its RQ worker is gone (or stays)."""
    from worker.tasks import worker_died

    def horse_verdict(worker_exits: bool) -> bytes:
        result_r, result_w = os.pipe()
        ready_r, ready_w = os.pipe()
        worker = os.fork()
        if worker == 0:  # the RQ worker
            horse = os.fork()
            if horse == 0:  # its work-horse
                parent = os.getppid()
                os.write(ready_w, b"r")
                os.write(result_w, b"died" if worker_died(parent, 5.0 if worker_exits else 0.3) else b"lives")
                os._exit(0)
            os.read(ready_r, 1)
            if not worker_exits:
                os.waitpid(horse, 0)
            os._exit(0)
        os.waitpid(worker, 0)
        os.close(result_w)
        verdict = os.read(result_r, 16)
        for fd in (result_r, ready_r, ready_w):
            os.close(fd)
        return verdict

    assert horse_verdict(worker_exits=True) == b"died"
    assert horse_verdict(worker_exits=False) == b"lives"



# --- a delivery taken by a worker that died before starting it ---------------------------------
# The whole worker is killed after one of its slots took the attempt from the node's queue
# and before the fenced start; the worker comes back within the grace (systemd, or the fault
# tests' second worker), so the node is never lost. RQ keeps saying "started" until a live
# worker's maintenance cleans the dead one's jobs up, every 10 minutes: the job sat in
# `starting` that long (seen in the concurrent-submission fault test).


@pytest.fixture
def dispatched(alice, teams, settings):
    settings.DISPATCH_REPAIR_S = 4.0
    register("node-a")
    job = make_job(team=teams["vision"], user=alice, gpus=1)
    tick()
    job = current(job)
    assert job.state == JobState.STARTING and job.dispatched_at is not None
    return job


def slot_takes(job, *, horse_marks_started: bool):
    """What RQ's own code writes when a slot of node-a takes the job (and its horse, if it got
    that far, marks it started); the worker then dies, so nothing more is written."""
    from rq import Queue, Worker

    from apps.core.redis_client import redis_client
    from apps.scheduling.dispatch import node_queue

    queue = node_queue("node-a")
    worker = Worker([queue], connection=redis_client(), name="node-a.0.4242.1")
    rq_job, _ = Queue.dequeue_any([queue], timeout=None, connection=redis_client())
    assert rq_job.id == job.rq_job_id
    worker.prepare_execution(rq_job)  # the slot, before it forks the horse
    if horse_marks_started:
        worker.prepare_job_execution(rq_job, remove_from_intermediate_queue=True)  # the horse
    return queue


def redispatches(job) -> list[str]:
    return list(JobEvent.objects.filter(job_id=job.pk, kind="redispatched").values_list("message", flat=True))


@pytest.mark.parametrize("horse_marks_started", [True, False], ids=["horse-started", "slot-took"])
def test_a_delivery_whose_worker_died_before_starting_it_is_sent_again(dispatched, horse_marks_started):
    queue = slot_takes(dispatched, horse_marks_started=horse_marks_started)
    taken = timezone.now()
    # The worker is back within the grace (its replacement heartbeats), whenever these ticks
    # happen: under load the fixture's registration can be more than NODE_GRACE_S - 5 s before
    # `taken`, and a lost node's job would be requeued instead (seen at load ~25: job.node None).
    alive = Node.objects.filter(name="node-a")
    alive.update(last_heartbeat=taken + 2 * S)
    tick(taken + 2 * S)  # a live horse would be starting it now
    assert redispatches(dispatched) == []

    alive.update(last_heartbeat=taken + 5 * S)
    tick(taken + 5 * S)  # DISPATCH_REPAIR_S after it was taken, it is still not running
    job = current(dispatched)
    assert (job.state, job.attempt, job.attempt_id, job.node.name) == (
        JobState.STARTING, 1, dispatched.attempt_id, "node-a")  # the same attempt, sent again
    [message] = redispatches(job)
    assert "died before starting it" in message, message
    assert queue.get_job_position(job.rq_job_id) == 0
    assert slots(job) == {("node-a", 0, job.attempt_id)}
    # The new worker's slot starts it; attempt 1 is the one that runs.
    started = attempt_start(job_id=job.pk, attempt_id=job.attempt_id, node_name="node-a")
    assert started is not None and started.attempt == 1


def test_a_delivery_waiting_in_its_queue_is_left_there(dispatched):
    later = timezone.now() + 60 * S  # every slot busy for a minute: it waits its turn
    Node.objects.filter(name="node-a").update(last_heartbeat=later)
    tick(later)
    assert redispatches(dispatched) == []
    assert current(dispatched).dispatched_at == dispatched.dispatched_at


def test_a_delivery_redis_lost_is_sent_again(dispatched):
    from apps.core.redis_client import redis_client

    redis_client().flushall()
    tick(timezone.now() + 5 * S)
    [message] = redispatches(dispatched)
    assert "Redis did not hold it" in message


# --- a worker that stops cleanly (SIGTERM/SIGINT; gpu_worker.leave) ------------------------------
# It marks its node lost once its slots have exited (apps.cluster.services.node_stopped) and
# kicks the scheduler; the live version is in tests/integration/test_faults.py.


def stop_worker(name: str = "node-a") -> None:
    from apps.cluster.services import node_stopped

    assert node_stopped(Node.objects.get(name=name), hostname=f"host-{name}", worker_pid=1234)


def register_two_gpus(name: str) -> Node:
    return node_register(name=name, gpus=simulated_gpus(2), cpu_count=8, memory_mb=32768,
                         hostname=f"host-{name}", worker_pid=1234)


def test_a_cleanly_stopped_nodes_jobs_are_requeued_in_the_next_pass_once(running, alice, teams):
    """No waiting for the grace period: the next pass requeues its attempt (one attempt, no retry)
    and places it, and a new job, on the node that still runs; the grace's end adds nothing."""
    stopped = timezone.now()
    beats(running, node_at=stopped, attempt_at=stopped)
    stop_worker()
    register_two_gpus("node-b")
    new = make_job(team=teams["vision"], user=alice, gpus=1)

    tick(stopped + S)  # well within NODE_GRACE_S (8 s)
    job = current(running)
    assert (job.state, job.node.name, job.attempt, job.retries_left) == (JobState.STARTING, "node-b", 2, 2)
    [lost] = JobEvent.objects.filter(job_id=job.pk, kind="node_lost")
    assert "the worker on node node-a stopped" in lost.message, lost.message
    assert (current(new).state, current(new).node.name) == (JobState.STARTING, "node-b")
    assert len(slots(job)) == 1 and {node for node, _, _ in slots(job)} == {"node-b"}

    Node.objects.filter(name="node-b").update(last_heartbeat=stopped + 20 * S)  # node-b keeps reporting
    tick(stopped + 20 * S)  # node-a's grace has long ended: nothing is requeued again
    assert (current(running).attempt, kinds(running).count("node_lost")) == (2, 1)
    assert Node.objects.get(name="node-a").state == Node.State.LOST


def test_a_placement_claimed_while_its_node_stopped_is_requeued_without_counting(alice, teams):
    """The pass planned with node-a still active, its worker stopped, then the claim committed:
    the next pass takes the placement back (it never started) and places it elsewhere."""
    node = register("node-a")
    job = make_job(team=teams["vision"], user=alice, gpus=1)
    stop_worker()
    assert job_claim(job, node=node, gpu_indices=[0], gpu_share=1.0, run_class="medium")
    delivered = current(job).attempt_id
    register("node-b")
    tick()
    job = current(job)
    assert (job.state, job.node.name, job.attempt) == (JobState.STARTING, "node-b", 1)
    assert attempt_start(job_id=job.pk, attempt_id=delivered, node_name="node-a") is None  # fenced off


def test_a_stopped_node_that_registers_again_takes_work(alice, teams):
    register("node-a")
    stop_worker()
    job = make_job(team=teams["vision"], user=alice, gpus=1)
    tick()
    assert current(job).state == JobState.QUEUED  # nowhere to run
    register("node-a")  # its worker restarted (a new process)
    tick()
    assert (current(job).state, current(job).node.name) == (JobState.STARTING, "node-a")


def test_a_node_whose_worker_got_sigterm_takes_no_new_work_but_keeps_what_it_runs(running, alice, teams):
    """From the signal (gpu_worker.drain → node_stopping) until its slots have exited and the node
    is lost, nothing new is placed there and what it runs is not requeued yet (it still runs)."""
    from apps.cluster.services import node_stopping

    register("node-c")  # a free GPU on a node about to stop
    assert node_stopping(Node.objects.get(name="node-c"), hostname="host-node-c", worker_pid=1234)
    assert node_stopping(Node.objects.get(name="node-a"), hostname="host-node-a", worker_pid=1234)
    new = make_job(team=teams["vision"], user=alice, gpus=1)
    tick()
    assert (current(new).state, current(new).node) == (JobState.QUEUED, None)
    assert (current(running).state, current(running).attempt) == (JobState.RUNNING, 1)
    stop_worker()  # node-a's slots have exited
    register("node-c")  # node-c's worker restarted
    tick()  # node-a's job is requeued (one attempt); node-c takes work again (one GPU: one of the two)
    assert (current(running).attempt, kinds(running).count("node_lost")) == (2, 1)
    placed = [job for job in (current(running), current(new)) if job.state == JobState.STARTING]
    assert [job.node.name for job in placed] == ["node-c"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(not django_settings.DATABASES["default"]["ENGINE"].endswith("postgresql"),
                    reason="SQLite serializes the two writers whole (BEGIN IMMEDIATE): PostgreSQL only")
def test_two_deliveries_of_one_attempt_start_it_once_on_postgresql(alice, teams):
    """Chaos run, seed 3 (PostgreSQL): two slots took the same delivery 4 ms apart and both
    starts won ("running" twice for attempt 1; one trained again after the job had succeeded).
    The second start waits on the first's row lock; once it commits, the row is no longer starting."""
    import threading

    from django.db import connection, transaction

    node = register("node-a")
    job = make_job(team=teams["vision"], user=alice, gpus=1)
    assert job_claim(job, node=node, gpu_indices=[0], gpu_share=1.0, run_class="medium")
    attempt_id = current(job).attempt_id
    second: list = []

    def deliver_again() -> None:
        try:
            second.append(attempt_start(job_id=job.pk, attempt_id=attempt_id, node_name="node-a"))
        finally:
            connection.close()

    with transaction.atomic():
        assert attempt_start(job_id=job.pk, attempt_id=attempt_id, node_name="node-a") is not None
        other = threading.Thread(target=deliver_again)
        other.start()
        deadline = time.monotonic() + 30
        with connection.cursor() as cursor:  # until the other start waits on our row lock
            while time.monotonic() < deadline:
                cursor.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
                if cursor.fetchone()[0]:
                    break
                time.sleep(0.02)
    other.join(30)
    assert second == [None]
    assert kinds(job).count("running") == 1


def test_a_placement_requeued_before_it_started_is_delivered_under_a_new_rq_id(dispatched):
    """It keeps its attempt number, not its attempt id: the same RQ id for the next placement
    overwrote the first's RQ job while its queue entry stayed, so one queued job was delivered
    twice with the new attempt's arguments (chaos21: refused deliveries)."""
    from apps.core.redis_client import redis_client
    from apps.scheduling.dispatch import node_queue

    first, first_attempt_id = dispatched.rq_job_id, dispatched.attempt_id
    assert job_requeue(dispatched, reason="taken back before it started")
    tick()
    again = current(dispatched)
    assert (again.state, again.attempt) == (JobState.STARTING, 1) and again.attempt_id != first_attempt_id
    assert again.rq_job_id != first
    queued = node_queue("node-a", redis_client()).get_job_ids()
    assert again.rq_job_id in queued and first in queued  # the stale entry is refused by its own attempt id
