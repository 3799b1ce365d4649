"""An attempt placed on GPUs whose previous holder still has them waits for their node lock
(worker.tasks.AttemptRunner.wait_for_gpus, review23 finding 3): GPU_WAIT_S for an attempt
killed at once, but as long as a gracefully preempted attempt on those GPUs may still be
finishing its epoch (its grace plus a margin), so the two trainings never share a GPU.

Real parts: the node's flock()s (worker.gpulock) held as a victim's work-horse holds them, the
services' preemption and claim, and a thread for the victim. Transactional: the wait checks in.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from apps.jobs.models import Job, JobEvent
from apps.jobs.services import attempt_finish, attempt_preempt, attempt_start, job_cancel, job_claim
from apps.scheduling.models import SchedulerConfig
from tests.jobs.factories import make_job
from worker import tasks
from worker.gpulock import GpuLocks, lock_dir
from worker.tasks import AttemptRunner

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

GRACE_S = 3.0


@pytest.fixture
def short_waits(monkeypatch, settings, tmp_path):
    """A 3 s preemption grace, and waits short enough to see which one applies."""
    settings.JOBS_DIR = tmp_path / "jobs"
    settings.DATA_DIR = tmp_path / "data"  # this test's own lock folder (worker.gpulock.lock_dir)
    monkeypatch.setattr(tasks, "GPU_WAIT_S", 0.5)
    monkeypatch.setattr(tasks, "PREVIOUS_STOP_MARGIN_S", 0.5)
    config = SchedulerConfig.current()
    config.preempt_grace_s = GRACE_S
    config.save()


def started_on(node, gpus: list[int], *, team, user) -> Job:
    job = make_job(team=team, user=user, gpus=len(gpus))
    assert job_claim(job, node=node, gpu_indices=gpus, gpu_share=1.0, run_class="medium")
    return attempt_start(job_id=job.pk, attempt_id=Job.objects.get(pk=job.pk).attempt_id, node_name=node.name)


def held_lock(gpus: list[int]) -> GpuLocks:
    """GPU locks as the victim's work-horse holds them until its training has stopped."""
    locks = GpuLocks(lock_dir("node-a", settings.DATA_DIR), gpus, exclusive=True)
    assert locks.try_acquire()
    return locks


def wait(job: Job) -> tuple[str, float, AttemptRunner, GpuLocks, list[str]]:
    """(why to stop, seconds waited, the runner, its locks, the wait's events) of ``job``'s attempt."""
    runner = AttemptRunner(Job.objects.select_related("node").get(pk=job.pk))
    locks = GpuLocks(lock_dir("node-a", settings.DATA_DIR), list(job.gpu_indices), exclusive=True)
    began = time.monotonic()
    stop = runner.wait_for_gpus(locks)
    took = time.monotonic() - began
    events = list(JobEvent.objects.filter(job_id=job.pk, kind__in=["waiting_for_gpus", "gpus_busy"])
                  .order_by("seq").values_list("kind", flat=True))
    return stop, took, runner, locks, events


def preempt(victim: Job, *, grace_s: float = GRACE_S) -> None:
    assert attempt_preempt(Job.objects.get(pk=victim.pk), reason="an urgent job", now=timezone.now(), grace_s=grace_s)


def test_the_preemptor_waits_past_gpu_wait_s_while_the_preempted_attempt_finishes_its_epoch(
        short_waits, node, teams, alice, bob):
    victim = started_on(node, [0], team=teams["vision"], user=alice)
    victim_locks = held_lock([0])
    preempt(victim)
    preemptor = started_on(node, [0], team=teams["vision"], user=bob)

    def victim_stops_at_its_epoch_end():
        time.sleep(1.5)  # three times GPU_WAIT_S: the old wait had given up and shared the GPU
        try:
            assert attempt_finish(victim, outcome="fenced") == "fenced"
        finally:
            victim_locks.release()
            connection.close()

    thread = threading.Thread(target=victim_stops_at_its_epoch_end)
    thread.start()
    stop, took, runner, locks, events = wait(preemptor)
    thread.join()
    assert stop == ""
    assert locks.fds, "the preemptor holds the GPU now"
    assert 1.4 < took < GRACE_S, took
    assert events == ["waiting_for_gpus"]
    assert took - 0.5 < runner.gpu_wait_s <= took  # taken from the training's budget (run_child)


def test_the_wait_for_a_preempted_attempt_ends_with_its_grace_when_it_never_stops(short_waits, node, teams, alice,
                                                                                   bob):
    victim = started_on(node, [0], team=teams["vision"], user=alice)
    victim_locks = held_lock([0])  # a child that ignores its stop file: killed only after the grace
    preempt(victim)
    preemptor = started_on(node, [0], team=teams["vision"], user=bob)
    try:
        stop, took, _, locks, events = wait(preemptor)
    finally:
        victim_locks.release()
    assert stop == ""
    assert not locks.fds
    assert GRACE_S < took < GRACE_S + 3, took
    assert events == ["waiting_for_gpus", "gpus_busy"]


def another_process(node, team, user) -> None:
    """Whatever holds the lock was never preempted with a grace here."""


def preempted_on_another_gpu(node, team, user) -> None:
    preempt(started_on(node, [1], team=team, user=user))


def preempted_without_grace(node, team, user) -> None:
    preempt(started_on(node, [0], team=team, user=user), grace_s=0)


def preempted_and_already_stopped(node, team, user) -> None:
    victim = started_on(node, [0], team=team, user=user)
    preempt(victim)
    assert attempt_finish(victim, outcome="fenced") == "fenced"


@pytest.mark.parametrize("holder", [another_process, preempted_on_another_gpu, preempted_without_grace,
                                    preempted_and_already_stopped])
def test_a_holder_that_is_not_a_preempted_attempt_stopping_is_waited_for_gpu_wait_s(short_waits, node, teams, alice,
                                                                                     bob, holder):
    holder(node, teams["vision"], alice)
    held = held_lock([0])
    preemptor = started_on(node, [0], team=teams["vision"], user=bob)
    try:
        stop, took, _, _, events = wait(preemptor)
    finally:
        held.release()
    assert stop == ""
    assert 0.4 < took < 2.0, took
    assert events == ["gpus_busy"]


def test_a_cancel_ends_the_wait_for_a_preempted_attempt(short_waits, node, teams, alice, bob):
    victim = started_on(node, [0], team=teams["vision"], user=alice)
    victim_locks = held_lock([0])
    preempt(victim)
    preemptor = started_on(node, [0], team=teams["vision"], user=bob)

    def owner_cancels():
        time.sleep(0.8)
        try:
            assert job_cancel(job=Job.objects.get(pk=preemptor.pk), by=bob)
        finally:
            connection.close()

    thread = threading.Thread(target=owner_cancels)
    thread.start()
    try:
        stop, took, _, locks, _ = wait(preemptor)
    finally:
        thread.join()
        victim_locks.release()
    assert stop == "cancelled"
    assert not locks.fds
    assert took < GRACE_S, took


def test_a_worker_whose_clock_is_ahead_still_waits_out_the_victims_grace(short_waits, node, teams, alice, bob,
                                                                         monkeypatch):
    """left30: the time since the preemption was this worker's clock less the scheduler's (which
    wrote the event): a worker 300 s ahead waited 300 s less of a 600 s grace, and its attempt
    then shared the GPU with a victim still finishing its epoch. Now counted on the database's
    clock. (The stand-in is the worker process's clock, Django's ``timezone.now``.)"""
    from datetime import timedelta

    from apps.jobs.services import gpus_stopping_left_s

    config = SchedulerConfig.current()
    config.preempt_grace_s = 600
    config.save()
    preempt(started_on(node, [0], team=teams["vision"], user=alice), grace_s=600)
    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(seconds=300))
    left = gpus_stopping_left_s(node_name="node-a", gpu_indices=[0], margin_s=15)
    assert 600 < left <= 615, left


def test_a_victim_preempted_before_the_grace_was_lowered_is_still_waited_for(short_waits, node, teams, alice):
    """left30: the lookup looked back only as far as the current preempt_grace_s. Lowered from 600 s
    to 60 s two minutes after a preemption, its victim (whose worker gives it the 600 s its event
    records) was no longer seen, and the next attempt on its GPU started beside it."""
    from datetime import timedelta

    from django.db.models import F

    from apps.jobs.services import gpus_stopping_left_s

    config = SchedulerConfig.current()
    config.preempt_grace_s = 600
    config.save()
    victim = started_on(node, [0], team=teams["vision"], user=alice)
    preempt(victim, grace_s=600)
    JobEvent.objects.filter(job_id=victim.pk, kind="preempted").update(created_at=F("created_at") - timedelta(seconds=120))
    config.preempt_grace_s = 60
    config.save()
    left = gpus_stopping_left_s(node_name="node-a", gpu_indices=[0], margin_s=15)
    assert 600 + 15 - 120 - 10 < left <= 600 + 15 - 120, left


def test_a_lowered_grace_is_looked_back_at_while_a_victim_may_still_run_it():
    """The longer of two lowerings in a row is kept; a raise records nothing; it counts until it
    (and the margin) could have run out since it was lowered."""
    from datetime import timedelta

    config = SchedulerConfig.current()
    config.preempt_grace_s = 900
    config.save()
    config.preempt_grace_s = 300
    config.save()
    config.preempt_grace_s = 60
    config.save()
    config.refresh_from_db()
    now = timezone.now()
    assert config.preempt_grace_lowered_from_s == 900
    assert config.grace_lookback_s(now=now, margin_s=15) == 900
    assert config.grace_lookback_s(now=now + timedelta(seconds=916), margin_s=15) == 60
    config.preempt_grace_s = 120
    config.save()
    config.refresh_from_db()
    assert config.preempt_grace_lowered_from_s == 900 and config.grace_lookback_s(now=now, margin_s=15) == 900


def test_a_worker_whose_clock_is_ahead_still_looks_back_at_a_lowered_grace(short_waits, node, teams, alice,
                                                                            monkeypatch):
    """review30: whether a lowered grace is still looked back at was this worker's clock less the
    time the admin's process wrote the lowering. Lowered from 600 s to 60 s 400 s ago, two minutes
    after a preemption: its victim may run 95 s more; a worker 300 s ahead thought the 615 s over
    (700 s) and looked back only 75 s. Counted on the database's clock, as the events' ages are."""
    from datetime import timedelta

    from django.db.models import F

    from apps.jobs.services import gpus_stopping_left_s

    config = SchedulerConfig.current()
    config.preempt_grace_s = 600
    config.save()
    victim = started_on(node, [0], team=teams["vision"], user=alice)
    preempt(victim, grace_s=600)
    config.preempt_grace_s = 60
    config.save()
    JobEvent.objects.filter(job_id=victim.pk, kind="preempted").update(created_at=F("created_at") - timedelta(seconds=520))
    SchedulerConfig.objects.filter(pk=config.pk).update(  # (not short_waits' 900 s -> 3 s lowering)
        preempt_grace_lowered_from_s=600, preempt_grace_lowered_at=F("preempt_grace_lowered_at") - timedelta(seconds=400))
    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(seconds=300))
    left = gpus_stopping_left_s(node_name="node-a", gpu_indices=[0], margin_s=15)
    assert 615 - 520 - 10 < left <= 615 - 520, left


def test_a_lowering_saved_from_an_instance_read_before_another_keeps_the_longer_grace():
    """review30: the grace a lowering replaced was kept with the longer one recorded on the saved
    instance, not in the row. Two admins: one lowers 1800 s to 900 s while the other, whose form was
    read before, lowers it on to 300 s; the record said 900 s, and a victim preempted under 1800 s
    (its worker still gives it that) was no longer looked back at after 915 s."""
    config = SchedulerConfig.current()
    config.preempt_grace_s = 1800
    config.save()
    first, second = SchedulerConfig.objects.get(pk=config.pk), SchedulerConfig.objects.get(pk=config.pk)
    first.preempt_grace_s = 900
    first.save()
    second.preempt_grace_s = 300
    second.save()
    config.refresh_from_db()
    assert config.preempt_grace_s == 300 and config.preempt_grace_lowered_from_s == 1800


def test_the_same_lowering_saved_twice_at_once_keeps_its_record():
    """review30: two admins lower 1800 s to 900 s at once; the second save is no lowering any more
    (the row already says 900 s) and wrote its instance's empty record over the first one's."""
    config = SchedulerConfig.current()
    config.preempt_grace_s = 1800
    config.save()
    first, second = SchedulerConfig.objects.get(pk=config.pk), SchedulerConfig.objects.get(pk=config.pk)
    first.preempt_grace_s = second.preempt_grace_s = 900
    first.save()
    second.save()
    config.refresh_from_db()
    assert config.preempt_grace_lowered_from_s == 1800 and config.preempt_grace_lowered_at is not None
