"""A GPU server tells that it sees this installation's shared storage by the marker the scheduler
writes into each shared root (apps/core/storage_marks.py), not by the datasets' files.

Before, a separate mount for JOBS_DIR or WEIGHTS_DIR that dropped alone went unseen, and the
newest three datasets' files deleted by hand took every node out of placement. A root pointed
at an empty folder is that node's view of a mount that dropped (the scheduler, in the same
process here, keeps the real one)."""

from __future__ import annotations

import shutil

import pytest
from django.core.management import CommandError, call_command

from apps.cluster.models import Node
from apps.core.models import StorageMark
from apps.core.storage_marks import MARKER_NAME, storage_marks_write
from apps.scheduling.inputs import cluster_nodes
from apps.scheduling.management.commands.scheduler import Chores
from worker.artifacts import shared_storage_problem
from worker.node import Heartbeat

pytestmark = pytest.mark.django_db


def register(name: str = "node-a") -> Node:
    from apps.cluster.services import node_register
    from worker.inventory import simulated_gpus

    return node_register(name=name, gpus=simulated_gpus(1), cpu_count=8, memory_mb=32768,
                         hostname=f"host-{name}", worker_pid=1234)


def placement(name: str = "node-a") -> tuple[bool, str]:
    (info,) = cluster_nodes(Node.objects.filter(name=name))
    return info.schedulable, info.unschedulable_because


@pytest.fixture
def marked(demo_registered, settings):
    """The installation as its scheduler leaves it: the marker in every shared root."""
    Chores().storage_marks()  # the scheduler's own chore
    return {name: getattr(settings, name) for name in ("DATASETS_DIR", "JOBS_DIR", "MODELS_DIR", "WEIGHTS_DIR")}


def test_the_scheduler_marks_every_shared_root_with_the_installations_token(marked):
    token = StorageMark.objects.get().token
    for folder in marked.values():
        assert (folder / MARKER_NAME).read_text().strip() == token
    assert StorageMark.objects.get().written_at is not None  # from now on the nodes check
    assert storage_marks_write() == 0  # a second pass has nothing to do


def test_a_node_whose_jobs_mount_dropped_alone_is_marked_naming_that_root_and_is_back_with_it(
        marked, settings, tmp_path):
    """Datasets still readable, so the old datasets-only check saw nothing wrong."""
    node = register()
    beat = Heartbeat(node, 1.0, simulated=True)
    beat.beat()
    assert placement() == (True, "")

    settings.JOBS_DIR = tmp_path / "mountpoint" / "jobs"  # this node's view: the empty mount point
    beat.beat()
    node = Node.objects.get(name="node-a")
    assert node.storage_problem == "shared storage unreachable: JOBS_DIR (no storage marker)"
    assert node.state == Node.State.ACTIVE  # reporting, not drained
    assert placement() == (False, "shared storage unreachable")

    settings.JOBS_DIR = marked["JOBS_DIR"]  # mounted again
    beat.beat()
    assert Node.objects.get(name="node-a").storage_problem == ""
    assert placement() == (True, "")


def test_a_weights_mount_of_another_installations_export_is_named_as_such(marked, settings, tmp_path):
    other = tmp_path / "other-export" / "weights"
    other.mkdir(parents=True)
    (other / MARKER_NAME).write_text("0123456789abcdef\n")  # another installation's scheduler wrote it
    settings.WEIGHTS_DIR = other
    node = register()
    Heartbeat(node, 1.0, simulated=True).beat()
    assert Node.objects.get(name="node-a").storage_problem == (
        "shared storage unreachable: WEIGHTS_DIR (another installation's storage marker)")


@pytest.fixture
def datasets_deleted(settings, tmp_path):
    """Every dataset's files gone from the storage (kept aside here: the session's demo dataset
    is every test's)."""
    aside = tmp_path / "aside"
    aside.mkdir()
    moved = [shutil.move(child, aside / child.name) for child in settings.DATASETS_DIR.iterdir()
             if child.name != MARKER_NAME]
    assert moved
    yield
    for child in aside.iterdir():
        shutil.move(child, settings.DATASETS_DIR / child.name)


def test_deleted_dataset_files_alone_leave_every_node_schedulable(marked, datasets_deleted):
    """The newest three datasets' files removed by hand (the storage itself fine): before, every
    node was marked unreachable and nothing was placed anywhere."""
    for name in ("node-a", "node-b"):
        Heartbeat(register(name), 1.0, simulated=True).beat()
        assert Node.objects.get(name=name).storage_problem == ""
        assert placement(name) == (True, "")
    assert shared_storage_problem() == ""  # and a worker starting now starts


@pytest.mark.timeout(60)
def test_a_worker_whose_view_lacks_the_marker_refuses_to_start_naming_the_root_and_its_path(
        marked, settings, tmp_path):
    settings.WEIGHTS_DIR = tmp_path / "node2" / "weights"
    with pytest.raises(CommandError) as refused:
        call_command("gpu_worker", "--name", "gpu-07", "--simulate-gpus", "1")
    said = str(refused.value)
    assert said.startswith("node gpu-07 not started: this machine's artifact storage lacks this installation's "
                           f"storage marker in WEIGHTS_DIR: {settings.WEIGHTS_DIR / MARKER_NAME} (no storage marker)")
    assert not Node.objects.filter(name="gpu-07").exists()


def test_a_marker_deleted_by_hand_is_written_again_by_the_schedulers_next_chore(marked):
    (marked["MODELS_DIR"] / MARKER_NAME).unlink()
    assert shared_storage_problem() != ""  # meanwhile every node would say MODELS_DIR
    Chores().storage_marks()
    assert shared_storage_problem() == ""


def test_the_scheduler_leaves_another_installations_marker_alone_and_the_nodes_keep_the_datasets_check(
        demo_registered, settings, tmp_path, caplog):
    """Overwriting it would hide a mount of the wrong export from every node; until every root
    holds this installation's token nobody checks for it."""
    other = tmp_path / "other-export" / "jobs"
    other.mkdir(parents=True)
    (other / MARKER_NAME).write_text("0123456789abcdef\n")
    settings.JOBS_DIR = other
    storage_marks_write()
    assert (other / MARKER_NAME).read_text() == "0123456789abcdef\n"
    assert "holds another installation's storage marker" in caplog.text
    assert StorageMark.objects.get().written_at is None
    assert shared_storage_problem() == ""  # the datasets are there: the fallback passes


def test_with_an_object_store_nothing_is_marked_or_checked(demo_registered, settings, moto):
    from django.test import override_settings

    from tests.s3 import s3_storages

    with override_settings(STORAGES=s3_storages(moto)):  # the roots are each node's own cache then
        assert storage_marks_write() == 0
        Heartbeat(register(), 1.0, simulated=True).beat()
    assert not (settings.JOBS_DIR / MARKER_NAME).exists()
    assert Node.objects.get(name="node-a").storage_problem == ""


# --- Slurm: the compute nodes run no worker of ours ------------------------------------------------
# Before, a Slurm node that lost its mount failed each job placed there as a "dataset problem" (or
# "ended FAILED without a report" when not even the relay could start), spending its retries.


@pytest.fixture
def slurm_partition(demo_registered, alice, teams, settings, live_server):
    """The slurm_agent of a one-node partition, the installation's storage marked, and a demo
    training job not yet placed; the relay reports to a real portal."""
    from apps.datasets.models import Dataset
    from apps.jobs.models import Job
    from tests.jobs.factories import make_job
    from tests.worker.test_shared_storage import PartitionOfOne
    from worker.executors.slurm import SlurmAgent

    Chores().storage_marks()
    settings.SLURM_PORTAL_URL = live_server.url
    agent = SlurmAgent("gpu", client=PartitionOfOne())
    agent.sync_nodes(force=True)
    job = make_job(team=teams["vision"], user=alice, gpus=1, retries_left=0)
    yaml_key = Dataset.objects.filter(team=teams["vision"]).values_list("yaml_key", flat=True).get()
    job.spec["resolved"] = {"data_yaml": yaml_key, "model": {"yaml": "yolov8n.yaml"}}
    Job.objects.filter(pk=job.pk).update(spec=job.spec)
    return agent, job


def slurm_submit(agent, job):
    """Place ``job`` on the partition's node and let the agent submit it: (agent, job, its attempt's record)."""
    from apps.jobs.models import ExecutorAttempt, Job
    from apps.jobs.services import job_claim

    assert job_claim(job, node=Node.objects.get(name="gpu01"), gpu_indices=[0], gpu_share=1.0, run_class="medium")
    assert agent.start_placed()
    job = Job.objects.select_related("node", "team", "user").get(pk=job.pk)
    return agent, job, ExecutorAttempt.objects.get(job=job, attempt=job.attempt)


@pytest.fixture
def slurm_placed(slurm_partition):
    """A job the slurm_agent has submitted to the one node of its partition."""
    return slurm_submit(*slurm_partition)


def slurm_ended(agent, record, state: str):
    """Slurm's word that the job ended (as the agent's watch reads it from squeue)."""
    from django.utils import timezone

    from apps.jobs.models import Job

    job = Job.objects.select_related("node", "team", "user").get(pk=record.job_id)
    agent.end(record, job, timezone.now(), state=state, current=True, exit_code=1)
    return Job.objects.get(pk=record.job_id)


@pytest.mark.django_db(transaction=True)  # the relay reports over HTTP to the live server
def test_a_slurm_node_that_lost_its_datasets_mount_hands_the_job_back_and_takes_no_work_for_a_while(
        slurm_placed, settings, monkeypatch):
    import json

    from apps.jobs.models import JobEvent, JobState
    from worker.executors import slurm
    from worker.executors.relay import Relay

    agent, job, record = slurm_placed
    attempt_dir = job.run_dir / "attempt-1"
    config = json.loads((attempt_dir / "relay.json").read_text())
    assert {mark["setting"] for mark in config["storage_marks"]} == {"DATASETS_DIR", "JOBS_DIR", "MODELS_DIR",
                                                                      "WEIGHTS_DIR"}

    # On the Slurm node: the same path, its mount gone (the agent's own is back before it looks).
    (settings.DATASETS_DIR / MARKER_NAME).unlink()
    assert Relay(config).run() == 1  # the training never started: it would fail as a dataset problem
    Chores().storage_marks()

    job = slurm_ended(agent, record, "FAILED")
    assert (job.state, job.attempt, job.retries_left) == (JobState.QUEUED, 2, 0)  # no retry spent
    requeued = JobEvent.objects.filter(job=job).latest("seq")
    assert requeued.kind == "storage_unavailable"
    assert requeued.message.startswith("Slurm node gpu01 lost the shared storage while the attempt ran: shared "
                                       "storage unreachable: DATASETS_DIR (no storage marker)")
    assert not (attempt_dir / "events-1.jsonl").exists()

    agent.sync_nodes(force=True)  # the agent's own storage is fine: the node stays out all the same
    assert placement("gpu01") == (False, "shared storage unreachable")
    monkeypatch.setattr(slurm, "SLURM_NODE_STORAGE_RETRY_S", 0.0)  # no worker there to say it is back: a while
    agent.sync_nodes(force=True)
    assert placement("gpu01") == (True, "")


@pytest.mark.django_db(transaction=True)
def test_a_slurm_job_that_could_not_even_open_its_output_file_is_requeued_as_the_nodes_lost_mount(slurm_placed):
    """No relay ran: Slurm fails the job at launch (FAILED, JobLaunchFailure, checked with Slurm
    22.05) when the node cannot open ``--output`` in the job's folder, which this machine sees."""
    from apps.jobs.models import JobEvent, JobState

    agent, job, record = slurm_placed
    job = slurm_ended(agent, record, "FAILED")
    assert (job.state, job.attempt, job.retries_left) == (JobState.QUEUED, 2, 0)
    assert JobEvent.objects.filter(job=job).latest("seq").message.startswith(
        "Slurm job 101 ended FAILED on gpu01, which lost the shared storage: shared storage unreachable: JOBS_DIR")
    assert Node.objects.get(name="gpu01").storage_problem.startswith("shared storage unreachable: JOBS_DIR")


@pytest.mark.django_db(transaction=True)
def test_a_slurm_node_taken_out_for_its_lost_mount_stays_out_when_the_agent_restarts(slurm_placed):
    """slurmgrace23 leftover: the agent kept which nodes it took out in memory only; restarted, its
    first sync put them back in service, and the next placement there failed the same way."""
    from datetime import timedelta

    from django.db.models import F

    from apps.jobs.models import JobEvent
    from tests.worker.test_shared_storage import PartitionOfOne
    from worker.executors.slurm import SLURM_NODE_STORAGE_RETRY_S, SlurmAgent

    agent, job, record = slurm_placed
    slurm_ended(agent, record, "FAILED")  # it could not even open its output file (test above)
    assert placement("gpu01") == (False, "shared storage unreachable")
    said = JobEvent.objects.get(job=job, kind="node_storage_lost")
    assert said.message.startswith("Slurm node gpu01 cannot read the shared storage (shared storage unreachable: "
                                   "JOBS_DIR")

    restarted = SlurmAgent("gpu", client=PartitionOfOne())
    restarted.sync_nodes(force=True)
    assert placement("gpu01") == (False, "shared storage unreachable")
    assert Node.objects.get(name="gpu01").storage_problem.startswith("shared storage unreachable: JOBS_DIR")

    # Taken out longer ago than SLURM_NODE_STORAGE_RETRY_S: tried again.
    JobEvent.objects.filter(pk=said.pk).update(
        created_at=F("created_at") - timedelta(seconds=SLURM_NODE_STORAGE_RETRY_S + 1))
    restarted = SlurmAgent("gpu", client=PartitionOfOne())
    restarted.sync_nodes(force=True)
    assert placement("gpu01") == (True, "")


@pytest.mark.django_db(transaction=True)
def test_a_restarted_slurm_agent_whose_first_look_hit_a_database_blip_still_recalls_the_nodes_it_took_out(
        slurm_placed, monkeypatch):
    """review24: node_storage_recall marks itself done before it reads the events. A failure of
    that read inside the slurm_agent's loop (which survives a failed pass: "keep the agent alive
    through a database blip") lost the recall for good: the next sync put the node back in
    service, for the next placement to fail the same way. (The command's very first sync runs
    outside that try, so a blip there restarts the process and a fresh agent recalls; the recall
    runs inside the loop when that first sync did not reach it: the agent's own storage unreadable
    at its start, `problem or self.node_storage_problem(...)`, or Slurm listing no nodes yet.)
    Failed before the lead fixed review24. Fix: set node_storage_recalled only after the read succeeded."""
    from django.db import OperationalError

    from apps.jobs.models import JobEvent
    from tests.worker.test_shared_storage import PartitionOfOne
    from worker.executors.slurm import SlurmAgent

    agent, job, record = slurm_placed
    slurm_ended(agent, record, "FAILED")  # it could not even open its output file
    assert placement("gpu01") == (False, "shared storage unreachable")

    restarted = SlurmAgent("gpu", client=PartitionOfOne())
    real_filter = JobEvent.objects.filter

    def blip(*args, **kwargs):
        if kwargs.get("kind") == "node_storage_lost":
            raise OperationalError("server closed the connection unexpectedly")
        return real_filter(*args, **kwargs)

    monkeypatch.setattr(JobEvent.objects, "filter", blip)
    with pytest.raises(OperationalError):
        restarted.sync_nodes(force=True)  # the pass fails; the agent's loop logs it and goes on
    monkeypatch.setattr(JobEvent.objects, "filter", real_filter)
    restarted.sync_nodes(force=True)
    assert placement("gpu01") == (False, "shared storage unreachable")


@pytest.mark.django_db(transaction=True)
def test_a_slurm_job_that_wrote_its_output_and_ended_without_a_report_still_fails_as_before(slurm_placed):
    from apps.jobs.models import JobState

    agent, job, record = slurm_placed
    (job.run_dir / "attempt-1" / f"slurm-{record.external_id}.out").write_text("Traceback …\n")  # the relay crashed
    job = slurm_ended(agent, record, "FAILED")
    assert job.state == JobState.FAILED
    assert "without a report from its relay" in job.error
    assert Node.objects.get(name="gpu01").storage_problem == ""


@pytest.mark.django_db(transaction=True)
def test_a_storage_lost_report_puts_only_known_roots_and_words_on_the_node(slurm_placed):
    """The attempt's token sits in its folder, where the job's own process can read it: what every
    user sees of the node is built from our words, not the report's."""
    from apps.jobs.models import ExecutorAttempt, JobState

    agent, job, record = slurm_placed
    ExecutorAttempt.objects.filter(pk=record.pk).update(report={
        "outcome": "storage_lost", "exit_code": 1,
        "error": {"kind": "storage", "message": "visit evil.example.com",
                  "roots": [["DATASETS_DIR", "see evil.example.com"], ["/etc", "no storage marker"]]}})
    job = slurm_ended(agent, record, "FAILED")
    assert job.state == JobState.QUEUED
    assert Node.objects.get(name="gpu01").storage_problem == "shared storage unreachable: DATASETS_DIR (unreadable)"


@pytest.mark.django_db(transaction=True)
def test_a_malformed_storage_lost_report_still_ends_the_attempt(slurm_placed):
    """A list where a word belongs (a report the job's own process posted) raised in the agent after
    it had finalized the attempt: the job stayed running, unwatched, until the reaper took it as a
    lost node (review22)."""
    from apps.jobs.models import ExecutorAttempt, JobState

    agent, job, record = slurm_placed
    ExecutorAttempt.objects.filter(pk=record.pk).update(report={
        "outcome": "storage_lost", "exit_code": 1, "error": {"kind": "storage", "roots": [["DATASETS_DIR", ["x"]]]}})
    job = slurm_ended(agent, record, "FAILED")
    assert job.state == JobState.QUEUED
    assert Node.objects.get(name="gpu01").storage_problem == "shared storage unreachable: DATASETS_DIR (unreadable)"

    # A report the outcome cannot be read from at all fails the attempt, saying so.
    agent, job, record = slurm_again(agent, job)
    ExecutorAttempt.objects.filter(pk=record.pk).update(report={"outcome": "failed", "error": "x", "exit_code": 1})
    job = slurm_ended(agent, record, "FAILED")
    assert job.state == JobState.FAILED
    assert "its relay's final report could not be read (AttributeError)" in job.error


def slurm_again(agent, job):
    """The job's next attempt, placed on the partition's node again (its storage problem cleared)."""
    from apps.cluster.services import node_storage_problem_set
    from apps.jobs.models import Job

    agent.node_storage.clear()
    node_storage_problem_set(Node.objects.get(name="gpu01"), problem="")
    return slurm_submit(agent, Job.objects.get(pk=job.pk))


@pytest.mark.django_db(transaction=True)
def test_a_job_whose_attempts_keep_reporting_lost_storage_is_not_believed_a_third_time(slurm_placed):
    """The report comes from the compute node, where the job's own process can post one: unbounded,
    one job took node after node out and requeued itself without end, no retry spent (review22)."""
    from apps.jobs.models import ExecutorAttempt, JobState

    agent, job, record = slurm_placed
    lost = {"outcome": "storage_lost", "exit_code": 1,
            "error": {"kind": "storage", "roots": [["DATASETS_DIR", "no storage marker"]]}}
    for attempt in (1, 2):
        ExecutorAttempt.objects.filter(pk=record.pk).update(report=lost)
        job = slurm_ended(agent, record, "FAILED")
        assert (job.state, job.attempt) == (JobState.QUEUED, attempt + 1)
        agent, job, record = slurm_again(agent, job)

    ExecutorAttempt.objects.filter(pk=record.pk).update(report=lost)
    job = slurm_ended(agent, record, "FAILED")
    assert job.state == JobState.FAILED  # retries_left 0: the job's own failure
    assert "not believed again (SLURM_STORAGE_LOST_MAX)" in job.error
    assert Node.objects.get(name="gpu01").storage_problem == ""  # the node stays in service


@pytest.mark.django_db(transaction=True)  # the relay reports over HTTP to the live server
def test_a_checkpoint_the_slurm_node_cannot_load_because_its_mount_went_is_kept(slurm_partition, settings):
    """Resuming while the node's mount is gone, the child cannot load the checkpoint (exit 4): the
    relay fell back to the next candidate, its report rejected the checkpoint (the row deleted),
    and the run went on from scratch without the storage (review22). The mount is the problem:
    the attempt is requeued, the checkpoint kept."""
    import hashlib
    import json
    import threading
    import time

    from apps.jobs.models import Checkpoint, ExecutorAttempt, JobState
    from worker.executors.relay import Relay

    agent, job = slurm_partition
    checkpoint = job.run_dir / "checkpoints" / "epoch-0002.pt"
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    checkpoint.write_bytes(b"half of a checkpoint, read through a mount that went away")
    Checkpoint.objects.create(job=job, epoch=2, attempt=1, path=str(checkpoint), size=checkpoint.stat().st_size,
                              sha256=hashlib.sha256(checkpoint.read_bytes()).hexdigest())
    agent, job, record = slurm_submit(agent, job)
    config = json.loads((job.run_dir / "attempt-1" / "relay.json").read_text())
    assert [run["epoch"] for run in config["runs"]] == [2, None]

    relay = Relay(config)

    def mount_goes_once_the_child_runs() -> None:  # past the relay's check before the training
        while relay.child is None:
            time.sleep(0.01)
        (settings.DATASETS_DIR / MARKER_NAME).unlink()

    threading.Thread(target=mount_goes_once_the_child_runs, daemon=True).start()
    assert relay.run() == 1  # signal handlers: the relay runs on the main thread
    assert ExecutorAttempt.objects.get(pk=record.pk).report["outcome"] == "storage_lost"
    assert not (job.run_dir / "attempt-1" / "events-2.jsonl").exists(), "no run from scratch without the storage"
    Chores().storage_marks()

    job = slurm_ended(agent, record, "FAILED")
    assert (job.state, job.attempt) == (JobState.QUEUED, 2)
    assert Checkpoint.objects.filter(job=job, epoch=2).exists()


@pytest.mark.django_db(transaction=True)  # the relay reports over HTTP to the live server
def test_a_slurm_training_that_succeeds_after_its_jobs_mount_went_is_requeued_not_a_success(
        slurm_partition, settings):
    """Its weights went to the compute node's empty mount point (worker/tasks.py storage_lost_check
    is the local worker's side)."""
    import json
    import threading
    import time

    from apps.jobs.models import ExecutorAttempt, JobState
    from worker.executors.relay import Relay

    agent, job = slurm_partition
    settings.SLURM_SIMULATED_GPUS = True  # it trains, on the CPU
    agent.sync_nodes(force=True)
    agent, job, record = slurm_submit(agent, job)
    relay = Relay(json.loads((job.run_dir / "attempt-1" / "relay.json").read_text()))

    def mount_goes_once_the_child_runs() -> None:  # past the relay's check before the training
        while relay.child is None:
            time.sleep(0.01)
        (settings.JOBS_DIR / MARKER_NAME).unlink()

    threading.Thread(target=mount_goes_once_the_child_runs, daemon=True).start()
    assert relay.run() == 1
    report = ExecutorAttempt.objects.get(pk=record.pk).report
    assert (report["outcome"], report["exit_code"]) == ("storage_lost", 0), "\n".join(report["log_tail"])  # the training itself succeeded
    Chores().storage_marks()

    job = slurm_ended(agent, record, "COMPLETED")
    assert (job.state, job.attempt) == (JobState.QUEUED, 2)
