"""Before it chooses its checkpoint, an attempt waits for a gracefully preempted previous attempt
to stop at its epoch end (worker.tasks.AttemptRunner.previous_attempt_wait, review22 finding 4):
bounded by the preemption's grace, and not at all after a crash, a lost node or a retry.

Transactional: the wait checks in (``close_old_connections``), as a work-horse does, and the
victim reports from another thread while the next attempt waits.
"""

from __future__ import annotations

import hashlib
import threading
import time

import pytest
from django.db import connection
from django.utils import timezone

from apps.cluster.models import Node
from apps.jobs.models import Job, JobEvent
from apps.jobs.services import (
    attempt_event_record,
    attempt_finish,
    attempt_lost,
    attempt_preempt,
    attempt_resume_choose,
    attempt_start,
    job_claim,
)
from tests.jobs.factories import make_job
from worker import tasks
from worker.tasks import AttemptRunner

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


@pytest.fixture
def running(alice, teams, node, settings, tmp_path):
    """Attempt 1 of a training job, started on node-a GPU 0, chose to start over (as every attempt
    chooses before it trains: AttemptRunner.resume_candidates), its epoch 1 checkpointed."""
    settings.JOBS_DIR = tmp_path / "jobs"
    job = make_job(team=teams["vision"], user=alice, gpus=1, retries_left=1)
    assert job_claim(job, node=node, gpu_indices=[0], gpu_share=1.0, run_class="medium")
    job = attempt_start(job_id=job.pk, attempt_id=Job.objects.get(pk=job.pk).attempt_id, node_name="node-a")
    assert attempt_resume_choose(job)
    epoch_end(job, 1)
    return job


def epoch_end(job: Job, epoch: int) -> None:
    """What the child reports at an epoch's end (worker/train_child.on_model_save), file written."""
    content = f"attempt {job.attempt} epoch {epoch}".encode()
    path = job.run_dir / "checkpoints" / f"epoch-{epoch:04d}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    attempt_event_record(job, {"type": "epoch", "epoch": epoch, "values": {"loss": 1.0 / epoch}})
    attempt_event_record(job, {"type": "checkpoint", "epoch": epoch, "path": str(path),
                               "sha256": hashlib.sha256(content).hexdigest(), "size": len(content)})


def next_attempt_started(job_id) -> Job:
    """The scheduler places the requeued job again and a worker starts it (running, nothing chosen)."""
    job = Job.objects.get(pk=job_id)
    assert job_claim(job, node=Node.objects.get(name="node-a"), gpu_indices=[1], gpu_share=1.0, run_class="medium")
    return attempt_start(job_id=job.pk, attempt_id=Job.objects.get(pk=job.pk).attempt_id, node_name="node-a")


def choose_while_the_victim_ends_its_epoch(job: Job, victim: Job, epoch: int):
    """:func:`choose` for ``job`` while, 1.5 s in (``job`` is waiting by then), the preempted
    ``victim`` records its epoch ``epoch`` and reports its stop, as its worker would."""
    def victim_stops_at_its_epoch_end():
        time.sleep(1.5)
        try:
            epoch_end(victim, epoch)
            assert attempt_finish(victim, outcome="fenced") == "fenced"
        finally:
            connection.close()

    thread = threading.Thread(target=victim_stops_at_its_epoch_end)
    thread.start()
    try:
        return choose(job)
    finally:
        thread.join()


def choose(job: Job) -> tuple[list[int | None], float, list[str]]:
    """(the epochs the attempt would try, seconds it took, the wait's events); the wait is taken
    from the training's timeout budget (the attempt held, and is charged for, its GPUs)."""
    began = time.monotonic()
    runner = AttemptRunner(Job.objects.get(pk=job.pk))
    candidates, stop = runner.resume_candidates()
    assert stop == ""
    took = time.monotonic() - began
    assert took - 1.0 < runner.previous_wait_s <= took or took < 1.0
    events = list(JobEvent.objects.filter(job_id=job.pk, attempt=job.attempt,
                                          kind__in=["waiting_for_previous_attempt", "previous_attempt_silent"])
                  .order_by("seq").values_list("kind", flat=True))
    return [c.epoch if c else None for c in candidates], took, events


def choose_within(job: Job, timeout_s: float) -> str | None:
    """The attempt's choice made in a thread: why it stopped ('' = it chose), or None when it was
    still waiting after ``timeout_s`` (then cancelled, which its check-in sees, so the test can end)."""
    from apps.jobs.services import job_cancel

    found = {}

    def choose_in_a_thread():
        try:
            found["stop"] = AttemptRunner(Job.objects.get(pk=job.pk)).resume_candidates()[1]
        finally:
            connection.close()

    thread = threading.Thread(target=choose_in_a_thread)
    thread.start()
    thread.join(timeout=timeout_s)
    if not thread.is_alive():
        return found["stop"]
    job_cancel(job=Job.objects.get(pk=job.pk), by=None)
    thread.join(timeout=10)
    return None


def test_it_waits_for_the_preempted_attempt_s_epoch_end_and_resumes_from_it(running):
    victim = running
    assert attempt_preempt(Job.objects.get(pk=victim.pk), reason="an urgent job", now=timezone.now(), grace_s=30)
    new = next_attempt_started(victim.pk)

    epochs, took, events = choose_while_the_victim_ends_its_epoch(new, victim, 2)
    assert epochs == [2, 1, None]
    assert 1.0 < took < 10, took
    assert events == ["waiting_for_previous_attempt"]


def test_an_attempt_preempted_while_it_waits_hands_the_wait_on_and_the_next_resumes_from_the_first_victim(
        running):
    """review23, 12: attempt 2, still waiting for attempt 1's epoch end, is preempted in turn and
    stops at once (it trained nothing). Attempt 3 did not wait for attempt 1, and attempt 1's epoch
    end was refused (only the attempt right after it was let wait): that epoch was trained again."""
    victim = running
    assert attempt_preempt(Job.objects.get(pk=victim.pk), reason="an urgent job", now=timezone.now(), grace_s=30)
    second = next_attempt_started(victim.pk)
    waiting = {}

    def second_waits():
        try:
            waiting["stop"] = AttemptRunner(Job.objects.get(pk=second.pk)).resume_candidates()[1]
        finally:
            connection.close()

    thread = threading.Thread(target=second_waits)
    thread.start()
    time.sleep(0.5)
    assert attempt_preempt(Job.objects.get(pk=second.pk), reason="a more urgent job", now=timezone.now(),
                           grace_s=30)
    thread.join(timeout=10)
    assert waiting == {"stop": "fenced"}  # its check-in saw the preemption
    assert attempt_finish(second, outcome="fenced") == "fenced"  # what AttemptRunner.finish reports
    third = next_attempt_started(victim.pk)
    assert third.attempt == 3

    epochs, took, events = choose_while_the_victim_ends_its_epoch(third, victim, 2)
    assert epochs == [2, 1, None]
    assert 1.0 < took < 10, took
    assert events == ["waiting_for_previous_attempt"]
    assert JobEvent.objects.get(job_id=victim.pk, attempt=3, kind="waiting_for_previous_attempt").data == {
        "attempt": 1}


def test_the_wait_ends_with_the_grace_when_the_preempted_attempt_never_reports(running, monkeypatch):
    monkeypatch.setattr(tasks, "PREVIOUS_STOP_MARGIN_S", 0.5)
    victim = running  # its node went silent, say: it never reports its stop
    assert attempt_preempt(Job.objects.get(pk=victim.pk), reason="an urgent job", now=timezone.now(), grace_s=1)
    new = next_attempt_started(victim.pk)
    epochs, took, events = choose(new)
    assert epochs == [1, None]  # what was recorded
    assert 0.5 < took < 5, took
    assert events == ["waiting_for_previous_attempt", "previous_attempt_silent"]


def requeued_after_a_crash(job: Job) -> None:
    assert attempt_finish(job, outcome="failed", exit_code=1, error="boom") == "retry"


def requeued_after_its_node_was_lost(job: Job) -> None:
    assert attempt_lost(Job.objects.get(pk=job.pk), reason="node-a silent for 9 s", now=timezone.now())


def preempted_without_grace(job: Job) -> None:
    assert attempt_preempt(Job.objects.get(pk=job.pk), reason="an urgent job", now=timezone.now(), grace_s=0)


def preempted_and_already_stopped(job: Job) -> None:
    assert attempt_preempt(Job.objects.get(pk=job.pk), reason="an urgent job", now=timezone.now(), grace_s=30)
    assert attempt_finish(job, outcome="fenced") == "fenced"


@pytest.mark.parametrize("requeue", [requeued_after_a_crash, requeued_after_its_node_was_lost,
                                     preempted_without_grace, preempted_and_already_stopped])
def test_nothing_is_awaited_when_the_previous_attempt_cannot_still_be_finishing_an_epoch(running, monkeypatch,
                                                                                          requeue):
    monkeypatch.setattr(tasks, "PREVIOUS_STOP_MARGIN_S", 30.0)  # a wait would show
    requeue(running)
    new = next_attempt_started(running.pk)
    epochs, took, events = choose(new)
    assert epochs == [1, None]
    assert took < 1.0, took
    assert events == []


def test_the_wait_is_bounded_by_the_grace_even_when_this_machine_s_clock_is_behind(running, monkeypatch):
    """review23: the bound is the preemption's time as the scheduler's clock wrote it, compared with
    this worker's clock: a worker one hour behind waited an hour (or until RQ's backstop ended the
    job as timed out), not the grace plus its margin, for a victim that never reported."""
    from datetime import timedelta

    from django.db.models import F


    monkeypatch.setattr(tasks, "PREVIOUS_STOP_MARGIN_S", 0.5)
    victim = running  # its worker died in the grace: it never reports its stop
    assert attempt_preempt(Job.objects.get(pk=victim.pk), reason="an urgent job", now=timezone.now(), grace_s=1)
    # The scheduler that wrote the preemption runs an hour ahead of this worker's clock.
    JobEvent.objects.filter(job_id=victim.pk, kind="preempted").update(created_at=F("created_at") + timedelta(hours=1))
    new = next_attempt_started(victim.pk)
    # the grace (1 s) and the margin (0.5 s), with room to spare
    assert choose_within(new, 10) == "", "still waiting 10 s into a 1.5 s bound"


def test_an_evacuated_job_does_not_wait_out_the_grace_once_the_drained_node_s_worker_has_stopped(
        running, monkeypatch):
    """review23: "drain and requeue", then the operator stops the drained node's worker for its
    maintenance. Its slots are killed with their work-horses, so the victim never reports
    ``attempt_stopped``; the worker marks the node lost (cluster.services.node_stopped). Nothing of
    the victim can record any more, yet its next attempt, on another node, held its GPUs idle (and
    charged) for the whole grace plus margin: 15 min with the default preempt_grace_s."""
    from apps.cluster.services import node_stopped
    from worker.inventory import simulated_gpus
    from worker.node import register_this_host

    victim = running
    register_this_host(name="node-b", gpus=simulated_gpus(1))
    assert attempt_preempt(Job.objects.get(pk=victim.pk), reason="node node-a is drained", now=timezone.now(),
                           grace_s=900)
    drained = Node.objects.get(name="node-a")
    assert node_stopped(drained, hostname=drained.hostname, worker_pid=drained.worker_pid)
    job = Job.objects.get(pk=victim.pk)
    assert job_claim(job, node=Node.objects.get(name="node-b"), gpu_indices=[0], gpu_share=1.0, run_class="medium")
    new = attempt_start(job_id=job.pk, attempt_id=Job.objects.get(pk=job.pk).attempt_id, node_name="node-b")
    assert choose_within(new, 5) == "", "waiting for a victim whose node's worker has stopped"


def test_an_attempt_whose_waits_used_up_its_timeout_ends_timed_out_without_starting_a_training(running):
    """review23: the waits (for the preempted previous attempt, for the GPUs' locks) are taken from
    the training's time budget, each; with nothing left the child was started only to be stopped at
    its first poll."""
    runner = AttemptRunner(Job.objects.get(pk=running.pk))
    runner.previous_wait_s, runner.gpu_wait_s = running.timeout_s / 2 + 1.0, running.timeout_s / 2
    result = runner.run_child(1, None)
    assert result.outcome == "timed_out"
    assert not (runner.attempt_dir / "config-1.json").exists()  # nothing was started


def test_an_attempt_that_never_chose_is_not_waited_for_once_the_attempt_that_chose_has_stopped(running, monkeypatch):
    """review24: attempt_previous_stop looks at every gracefully preempted attempt from the latest
    chooser on, and when that one has stopped it waits for the next one in the range, which never
    chose and so trained nothing: there is no epoch end to wait for. That attempt stops at its next
    check-in, but one fetching a large input hears the fence from its heartbeat thread and stops
    only once the fetch returns (worker.artifacts.with_storage: ``if beat["stop"]`` after
    ``action()``), and the new attempt sat on its GPUs, idle and charged, up to that preemption's
    whole grace plus the margin (900 + 15 s by default). chain24 left this as "harmless, seconds"; with
    resume_chosen_attempt the fix is now one line.
    Failed before the lead fixed review24 (waits the 3 s grace below). Fix: look only at attempt ``resume_chosen_attempt``
    (when 1 <= it <= previous): the attempts after it never chose, so none of them can add a row."""
    monkeypatch.setattr(tasks, "PREVIOUS_STOP_MARGIN_S", 0.5)
    first = running  # attempt 1 chose (and trained its epoch 1)
    assert attempt_preempt(Job.objects.get(pk=first.pk), reason="an urgent job", now=timezone.now(), grace_s=30)
    assert attempt_finish(first, outcome="fenced") == "fenced"  # it stopped at its epoch end: attempt_stopped
    second = next_attempt_started(first.pk)
    # Preempted before it chose, while its worker fetches the dataset: it reports its stop only later.
    assert attempt_preempt(Job.objects.get(pk=second.pk), reason="a more urgent job", now=timezone.now(),
                           grace_s=3)
    third = next_attempt_started(first.pk)
    assert third.attempt == 3

    epochs, took, events = choose(third)
    assert epochs == [1, None]
    assert events == [] and took < 1.0, (events, took)


def test_a_first_attempt_that_never_chose_is_not_waited_for(alice, teams, node, settings, tmp_path, monkeypatch):
    """review25: review24's finding 5 for attempt 1. 2786901 looks only at attempt
    ``resume_chosen_attempt``, but falls back to ``job.attempt - 1`` when it is 0 (``or job.attempt
    - 1``), and 0 is exactly "no attempt of this job chose": attempt 1 preempted with a grace while
    its worker fetched the dataset trained nothing, yet attempt 2 sits on its GPUs, idle and
    charged, until attempt 1's worker hears the fence after the fetch (up to the grace plus the
    margin, 900 + 15 s by default). Failed before the lead fixed review25 (waits the 3 s grace below).
    Fix: 0 → None. The fallback's other use (a job inserted by the previous release during migrate,
    db_default 0, whose attempt chose with the old mark only) is covered by folding the old mark
    into resume_chosen_attempt in job_requeue (see tests/jobs/test_migration_chosen_attempt.py)."""
    monkeypatch.setattr(tasks, "PREVIOUS_STOP_MARGIN_S", 0.5)
    settings.JOBS_DIR = tmp_path / "jobs"
    job = make_job(team=teams["vision"], user=alice, gpus=1, retries_left=1)
    assert job_claim(job, node=node, gpu_indices=[0], gpu_share=1.0, run_class="medium")
    first = attempt_start(job_id=job.pk, attempt_id=Job.objects.get(pk=job.pk).attempt_id, node_name="node-a")
    # Preempted before it chose, while its worker fetches the dataset: it reports its stop only later.
    assert attempt_preempt(Job.objects.get(pk=first.pk), reason="an urgent job", now=timezone.now(), grace_s=3)
    second = next_attempt_started(first.pk)
    assert second.attempt == 2 and Job.objects.get(pk=job.pk).resume_chosen_attempt == 0

    epochs, took, events = choose(second)
    assert epochs == [None]
    assert events == [] and took < 1.0, (events, took)


def test_a_worker_whose_clock_is_ahead_still_waits_out_the_previous_attempts_grace(running, monkeypatch):
    """left30: the other side of review23's clock-behind bound: a worker 300 s ahead of the
    scheduler's clock counted 300 s of a 600 s grace as gone. Counted on the database's clock now."""
    from datetime import timedelta

    from apps.jobs.services import attempt_previous_stop

    assert attempt_preempt(Job.objects.get(pk=running.pk), reason="an urgent job", now=timezone.now(), grace_s=600)
    new = next_attempt_started(running.pk)
    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(seconds=300))
    stop = attempt_previous_stop(new, margin_s=15)
    assert stop is not None and 600 < stop.left_s <= 615, stop
