"""GPU slots: the database itself refuses to give one GPU share to two attempts."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from apps.jobs.models import SLOTS_PER_GPU, GpuSlot, Job, JobState
from apps.jobs.services import attempt_finish, job_claim, job_requeue, slots_needed
from apps.jobs.spec import FRACTIONS

from .factories import make_job

pytestmark = pytest.mark.django_db


def claim(job, node, gpus=(0,), share=1.0) -> bool:
    return job_claim(job, node=node, gpu_indices=list(gpus), gpu_share=share, run_class="medium")


def held(job) -> list[tuple[int, int]]:
    return list(GpuSlot.objects.filter(job=job).values_list("gpu_index", "slot").order_by("gpu_index", "slot"))


def test_every_share_a_user_may_ask_for_is_a_whole_number_of_slots():
    assert all(slots_needed(f) == f * SLOTS_PER_GPU for f in FRACTIONS)
    assert slots_needed(1.0) == slots_needed(3.0) == SLOTS_PER_GPU


def test_a_claim_takes_every_slot_of_each_whole_gpu(alice, teams, node):
    job = make_job(team=teams["vision"], user=alice)
    assert claim(job, node, gpus=(0, 1))
    assert held(job) == [(g, s) for g in (0, 1) for s in range(SLOTS_PER_GPU)]
    assert Job.objects.get(pk=job.pk).state == JobState.STARTING


def test_shares_pack_one_gpu_until_it_is_full(alice, teams, node):
    jobs = [make_job(team=teams["vision"], user=alice, task_name=f"s{i}") for i in range(5)]
    for job, share in zip(jobs, (0.5, 0.25, 0.125, 0.125), strict=False):
        assert claim(job, node, share=share), share
    assert GpuSlot.objects.filter(node=node, gpu_index=0).count() == SLOTS_PER_GPU
    assert not claim(jobs[4], node, share=0.125)
    assert Job.objects.get(pk=jobs[4].pk).state == JobState.QUEUED and held(jobs[4]) == []


def test_a_claim_on_a_held_gpu_writes_nothing(alice, teams, node):
    """A stale plan (or another scheduler) puts a job on a GPU that is taken: the claim is refused whole."""
    first = make_job(team=teams["vision"], user=alice, task_name="first")
    second = make_job(team=teams["vision"], user=alice, task_name="second")
    assert claim(first, node, gpus=(1,), share=0.25)
    assert not claim(second, node, gpus=(0, 1))
    second.refresh_from_db()
    assert (second.state, second.node_id, second.gpu_indices, held(second)) == (JobState.QUEUED, None, [], [])


def test_a_requeue_frees_the_old_attempts_slots(alice, teams, node):
    job = make_job(team=teams["vision"], user=alice)
    assert claim(job, node)
    job.refresh_from_db()
    assert job_requeue(job, reason="preempted")
    assert held(job) == []
    job.refresh_from_db()
    assert claim(job, node)  # the new attempt takes them again
    assert set(GpuSlot.objects.filter(job=job).values_list("attempt_id", flat=True)) == {job.attempt_id}


@pytest.mark.parametrize("outcome", ["succeeded", "cancelled", "timed_out", "failed"])
def test_the_end_of_an_attempt_frees_its_slots(alice, teams, node, outcome):
    job = make_job(team=teams["vision"], user=alice)
    assert claim(job, node)
    job.refresh_from_db()
    attempt_finish(job, outcome=outcome, exit_code=0 if outcome == "succeeded" else 1)
    assert held(job) == [] and not GpuSlot.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_two_schedulers_racing_for_one_gpu_get_it_once(alice, teams, node):
    """Two threads (two database sessions) claim different jobs onto the same GPU at once."""
    jobs = [make_job(team=teams["vision"], user=alice, task_name=f"race{i}") for i in range(2)]
    start = threading.Barrier(2)
    won = []

    def race(job):
        try:
            start.wait()
            won.append(claim(job, node))
        finally:
            connection.close()

    threads = [threading.Thread(target=race, args=(job,)) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(won) == [False, True]
    assert GpuSlot.objects.filter(node=node, gpu_index=0).count() == SLOTS_PER_GPU
    assert Job.objects.filter(state=JobState.STARTING).count() == 1
