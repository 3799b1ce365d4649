"""Graceful preemption of an attempt running under Slurm, as a local worker's victim: its relay
hears "preempted" and stops the training after the current epoch's checkpoint, which is recorded
and which the next attempt resumes from; the agent leaves it running meanwhile and scancels it
only once its grace is over. A person's cancel stays immediate.

Before, the portal answered such a relay "fenced" (it killed the training at once) and the agent
scancelled it at its next look: the work since its last checkpoint was lost.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from apps.cluster.models import Node
from apps.jobs.models import Checkpoint, ExecutorAttempt, Job, JobEvent, JobState
from apps.jobs.services import (
    attempt_preempt,
    attempt_previous_stop,
    attempt_report,
    attempt_start,
    attempt_stop_by,
    job_cancel,
    job_claim,
)
from tests.jobs.factories import make_job
from tests.worker.test_shared_storage import PartitionOfOne
from tests.worker.test_storage_marks import slurm_partition, slurm_submit  # noqa: F401 - a fixture
from worker.executors.relay import Relay
from worker.executors.slurm import SLURM_SCANCEL_RESEND_S, SLURM_STOP_MARGIN_S, SlurmAgent, SlurmError, SlurmJob
from worker.tasks import PREVIOUS_STOP_MARGIN_S


class Partition(PartitionOfOne):
    """The one-node partition, with Slurm's word for our jobs and the scancels asked."""

    def __init__(self) -> None:
        super().__init__()
        self.states: dict[str, str] = {}
        self.cancelled: list[str] = []

    def jobs(self):
        return [slurm_job(job_id, state) for job_id, state in self.states.items()]

    def cancel(self, job_id):
        self.cancelled.append(job_id)


def slurm_job(job_id: str, state: str) -> SlurmJob:
    return SlurmJob(job_id=job_id, name="yp-x", state=state, reason="None", nodes="gpu01", partition="gpu", cpus=1,
                    memory_mb=4096, gpus=1, submit_time=0, start_time=0, end_time=0, time_limit_min=60,
                    exit_code=1 if state == "FAILED" else 0)


def preempt(job_id, grace_s: float) -> Job:
    """What the scheduler does to a victim (apps.scheduling: attempt_preempt in the claim's savepoint)."""
    attempt_preempt(Job.objects.get(pk=job_id), reason="a higher-priority job needs its GPU", now=timezone.now(),
                    grace_s=grace_s)
    return Job.objects.get(pk=job_id)


@pytest.mark.django_db(transaction=True)  # the relay reports over HTTP to the live server
@pytest.mark.timeout(420)
def test_a_preempted_slurm_attempt_stops_at_its_epoch_end_and_the_next_attempt_resumes_from_it(
        slurm_partition, settings):  # noqa: F811 - the fixture imported above
    agent, job = slurm_partition
    settings.SLURM_SIMULATED_GPUS = True  # it trains, on the CPU
    agent.client = client = Partition()
    agent.sync_nodes(force=True)
    job.spec["train_args"]["epochs"] = 6  # preempted well before its last epoch
    Job.objects.filter(pk=job.pk).update(spec=job.spec)
    agent, job, record = slurm_submit(agent, Job.objects.get(pk=job.pk))
    client.states[record.external_id] = "RUNNING"
    relay = Relay(json.loads((job.run_dir / "attempt-1" / "relay.json").read_text()))
    seen = {}

    def preempt_after_the_first_checkpoint() -> None:  # the scheduler, and the agent's looks meanwhile
        try:
            deadline = time.monotonic() + 300
            while not Checkpoint.objects.filter(job_id=job.pk).exists() and time.monotonic() < deadline:
                time.sleep(0.2)
            preempt(job.pk, grace_s=300)
            while relay.child is not None and relay.child.poll() is None:
                agent.watch()  # Slurm says it runs: within its grace it is left to stop by itself
                time.sleep(0.5)
            seen["cancelled"] = list(client.cancelled)
        finally:
            connection.close()

    thread = threading.Thread(target=preempt_after_the_first_checkpoint, daemon=True)
    thread.start()
    assert relay.run() == 1  # signal handlers: the relay runs on the main thread
    thread.join(60)
    assert seen["cancelled"] == [], "no scancel while the victim finishes its epoch"

    report = ExecutorAttempt.objects.get(pk=record.pk).report
    assert (report["exit_code"], report["outcome"]) == (5, "fenced"), "\n".join(report["log_tail"])  # not timed_out
    stopped = JobEvent.objects.get(job_id=job.pk, kind="stopped_at_epoch_end")
    epoch = stopped.data["epoch"]
    assert stopped.attempt == 1 and 1 <= epoch < 6
    assert JobEvent.objects.filter(job_id=job.pk, kind="stopping", attempt=1).exists()
    assert Checkpoint.objects.filter(job_id=job.pk, epoch=epoch, attempt=1).exists(), "its epoch end is recorded"
    job = Job.objects.get(pk=job.pk)
    assert (job.state, job.attempt, job.epochs_done) == (JobState.QUEUED, 2, epoch)

    # Slurm says the batch step ended: the agent reports the stop, and the next attempt stops waiting.
    client.states[record.external_id] = "FAILED"
    assert agent.watch()
    assert JobEvent.objects.filter(job_id=job.pk, kind="attempt_stopped", attempt=1).exists()
    assert attempt_previous_stop(job, margin_s=PREVIOUS_STOP_MARGIN_S) is None
    assert client.cancelled == []

    assert job_claim(job, node=Node.objects.get(name="gpu01"), gpu_indices=[0], gpu_share=1.0, run_class="medium")
    assert agent.start_placed()
    config = json.loads((job.run_dir / "attempt-2" / "relay.json").read_text())
    assert config["runs"][0]["epoch"] == epoch  # resumes from the victim's epoch end
    assert not JobEvent.objects.filter(job_id=job.pk, kind="previous_attempt_silent").exists()


@pytest.fixture
def running(alice, teams, node):
    """Attempt 1 of a job submitted to Slurm as job 42, running there: (agent, job, record)."""
    job = make_job(team=teams["vision"], user=alice, gpus=1)
    assert job_claim(job, node=node, gpu_indices=[0], gpu_share=1.0, run_class="medium")
    job = attempt_start(job_id=job.pk, attempt_id=job.attempt_id, node_name="node-a")
    record = ExecutorAttempt.objects.create(job=job, attempt=1, attempt_id=job.attempt_id, executor="slurm",
                                            external_id="42", submitted_at=timezone.now(), external_state="RUNNING")
    client = Partition()
    client.states["42"] = "RUNNING"
    return SlurmAgent("gpu", client=client), job, record


def look(agent, record, at):
    """The agent's look at the Slurm job (as its watch reads squeue) at time ``at``."""
    record.refresh_from_db()
    return agent.watch_one(record, agent.client.jobs()[0], at)


def answer(job, record) -> str:
    """What the portal answers the attempt's relay."""
    return attempt_report(Job.objects.get(pk=job.pk), attempt_id=record.attempt_id, events=[], log="", final=None)


@pytest.mark.django_db
def test_a_preempted_slurm_attempt_is_scancelled_once_its_grace_is_over(running):
    agent, job, record = running
    preempt(job.pk, grace_s=60)
    stop_by = attempt_stop_by(job)
    assert stop_by is not None

    assert not look(agent, record, timezone.now())
    assert not look(agent, record, stop_by + timedelta(seconds=SLURM_STOP_MARGIN_S - 1))
    assert agent.client.cancelled == []
    assert answer(job, record) == "preempted"

    assert look(agent, record, stop_by + timedelta(seconds=SLURM_STOP_MARGIN_S + 1))
    assert agent.client.cancelled == ["42"]
    JobEvent.objects.filter(job_id=job.pk, kind="preempted").update(created_at=timezone.now() - timedelta(seconds=61))
    assert answer(job, record) == "fenced"  # its relay kills the training itself


@pytest.mark.django_db
@pytest.mark.parametrize(("grace_s", "slurm_state", "said"), [(0, "RUNNING", "fenced"), (60, "PENDING", "preempted")])
def test_a_slurm_attempt_preempted_without_grace_or_not_yet_running_is_scancelled_at_once(
        running, grace_s, slurm_state, said):
    """Nothing to finish: no grace given, or no training started yet in Slurm."""
    agent, job, record = running
    agent.client.states["42"] = slurm_state
    preempt(job.pk, grace_s=grace_s)
    assert look(agent, record, timezone.now()) and agent.client.cancelled == ["42"]
    assert answer(job, record) == said


@pytest.mark.django_db
def test_a_cancel_asked_in_the_portal_is_still_scancelled_at_once(running, alice):
    agent, job, record = running
    job_cancel(job=job, by=alice)
    assert look(agent, record, timezone.now()) and agent.client.cancelled == ["42"]
    assert answer(job, record) == "cancelled"


@pytest.mark.django_db
def test_a_preempted_slurm_attempt_whose_job_is_cancelled_during_its_grace_is_scancelled_at_once(running, alice):
    agent, job, record = running
    job = preempt(job.pk, grace_s=600)
    assert not look(agent, record, timezone.now())
    assert job_cancel(job=job, by=alice) and Job.objects.get(pk=job.pk).state == JobState.CANCELLED  # it was queued
    assert look(agent, record, timezone.now()) and agent.client.cancelled == ["42"]
    assert answer(job, record) == "cancelled"


@pytest.mark.django_db
def test_a_scancel_is_sent_once_and_again_only_if_slurm_still_lists_the_job_long_after(running, alice):
    """slurmgrace23: the look after a scancel wrote Slurm's reason over the agent's "scancel:" mark,
    so it scancelled again at every poll (each second) until the job ended."""
    agent, job, record = running
    job_cancel(job=job, by=alice)
    asked = timezone.now()
    assert look(agent, record, asked) and agent.client.cancelled == ["42"]
    for seconds in (1, 2, 30, SLURM_SCANCEL_RESEND_S - 1):  # Slurm still says RUNNING, reason "None"
        assert not look(agent, record, asked + timedelta(seconds=seconds))
    assert agent.client.cancelled == ["42"]
    assert ExecutorAttempt.objects.get(pk=record.pk).scancel_reason == "cancel requested"
    assert look(agent, record, asked + timedelta(seconds=SLURM_SCANCEL_RESEND_S + 1))
    assert not look(agent, record, asked + timedelta(seconds=SLURM_SCANCEL_RESEND_S + 2))
    assert agent.client.cancelled == ["42", "42"]


@pytest.mark.django_db
def test_a_scancel_that_failed_is_sent_again_at_the_next_look(running, alice):
    agent, job, record = running
    job_cancel(job=job, by=alice)
    cancel, agent.client.cancel = agent.client.cancel, lambda job_id: (_ for _ in ()).throw(
        SlurmError("slurm_load_jobs error: Unable to contact slurm controller"))
    assert not look(agent, record, timezone.now())
    agent.client.cancel = cancel
    assert look(agent, record, timezone.now()) and agent.client.cancelled == ["42"]
