"""A GPU server on the shared filesystem starts only where it sees the installation's storage
(operator trial 20, F6)."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from apps.cluster.models import Node
from worker.artifacts import shared_storage_problem

pytestmark = pytest.mark.django_db


@pytest.mark.timeout(60)  # before the fix the worker started and ran until killed
def test_a_worker_with_a_data_dir_of_its_own_refuses_to_start_and_says_why(demo_registered, settings, tmp_path):
    """Started with DATA_DIR=/srv/node2 and no bucket, it registered, took jobs and failed each one
    for good ("dataset YAML not found: demo/data.yaml")."""
    settings.DATASETS_DIR = tmp_path / "node2" / "datasets"  # this machine's own, empty disk
    with pytest.raises(CommandError) as refused:
        call_command("gpu_worker", "--name", "gpu-07", "--simulate-gpus", "1")
    said = str(refused.value)
    assert said.startswith("node gpu-07 not started: this machine's artifact storage lacks ")
    assert "demo" in said and "every machine must mount the same DATA_DIR at the same path" in said
    assert "ARTIFACTS_S3_" in said
    assert not Node.objects.filter(name="gpu-07").exists()  # never registered: the scheduler sends it nothing


def test_the_shared_storage_and_an_empty_installation_pass(demo_registered, settings, tmp_path):
    assert shared_storage_problem() == ""
    from apps.datasets.models import Dataset

    Dataset.objects.all().delete()
    settings.DATASETS_DIR = tmp_path / "elsewhere"
    assert shared_storage_problem() == ""  # no dataset yet: nothing to look for


def test_one_lost_dataset_file_does_not_keep_a_worker_on_the_shared_storage_from_starting(demo_registered):
    """Only when none of the newest three datasets is where the database says is the storage not this
    machine's: one file lost on the shared storage must not stop every worker of the cluster."""
    from apps.datasets.models import Dataset

    lost = Dataset.objects.order_by("-created_at").first()
    lost.pk, lost.version = None, lost.version + 1
    lost.key, lost.yaml_key = f"{lost.key}-lost", f"{lost.key}-lost/data.yaml"
    lost.save()
    assert shared_storage_problem() == ""


# --- the shared storage lost while the worker runs -------------------------------------------------
# A node whose mount of the shared DATA_DIR dropped after its worker started took job after job
# and failed each one for good as a "dataset problem". A DATASETS_DIR pointed at an empty folder
# is that node's view of the storage (the live test renames the real folder instead).


def register(name: str = "node-a") -> Node:
    from apps.cluster.services import node_register
    from worker.inventory import simulated_gpus

    return node_register(name=name, gpus=simulated_gpus(1), cpu_count=8, memory_mb=32768,
                         hostname=f"host-{name}", worker_pid=1234)


@pytest.fixture
def placed(demo_registered, alice, teams):
    """A demo training placed on node-a (starting), as the scheduler leaves it for the worker."""
    from apps.datasets.models import Dataset
    from apps.jobs.models import Job
    from apps.jobs.services import job_claim
    from tests.jobs.factories import make_job

    node = register()
    yaml_key = Dataset.objects.filter(team=teams["vision"]).values_list("yaml_key", flat=True).get()
    job = make_job(team=teams["vision"], user=alice, gpus=1, retries_left=1)
    job.spec["resolved"] = {"data_yaml": yaml_key, "model": {"yaml": "yolov8n.yaml"}}
    Job.objects.filter(pk=job.pk).update(spec=job.spec)
    assert job_claim(job, node=node, gpu_indices=[0], gpu_share=1.0, run_class="medium")
    return Job.objects.select_related("node").get(pk=job.pk)


@pytest.fixture
def storage_lost(settings, tmp_path):
    settings.DATASETS_DIR = tmp_path / "mountpoint" / "datasets"  # what an unmounted DATA_DIR shows


def kinds(job) -> list[str]:
    from apps.jobs.models import JobEvent

    return list(JobEvent.objects.filter(job_id=job.pk).order_by("seq").values_list("kind", flat=True))


@pytest.mark.django_db(transaction=True)  # run_attempt closes stale connections, as a work-horse must
def test_a_placement_on_a_node_that_lost_the_storage_goes_back_to_the_queue_and_the_node_takes_no_more(
        placed, storage_lost, monkeypatch):
    """The work-horse's entry point: nothing started, the job queued as the placement it was (same
    number, its retry kept), the node marked, and the next pass places nothing there."""
    from apps.jobs.models import Job, JobEvent, JobState
    from apps.scheduling.loop import tick
    from worker.tasks import run_attempt

    monkeypatch.setenv("YOLOPORTAL_NODE", "node-a")
    assert run_attempt(str(placed.pk), str(placed.attempt_id)) == "storage_unavailable"
    job = Job.objects.get(pk=placed.pk)
    assert (job.state, job.attempt, job.retries_left, job.node_id) == (JobState.QUEUED, 1, 1, None)
    handed_back = JobEvent.objects.get(job_id=job.pk, kind="storage_unavailable")
    assert "node node-a cannot read the shared storage" in handed_back.message
    assert "running" not in kinds(job) and not (job.run_dir / "attempt-1").exists()
    node = Node.objects.get(name="node-a")
    assert "shared DATA_DIR is not readable" in node.storage_problem
    assert str(placed.pk) not in node.storage_problem and "/" not in node.storage_problem.split(":")[0]

    tick()  # the scheduler's next pass: the only node takes no new work, and the job says why
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
    assert "node-a (shared storage unreachable)" in job.reason, job.reason


def test_a_missing_file_on_storage_that_is_there_stays_the_jobs_own_problem(placed, monkeypatch, settings):
    """One dataset folder gone while the others are where they belong: started as before, and the
    child's "dataset problem" is the job's (no node marked)."""
    from apps.jobs.models import Job
    from worker.tasks import storage_lost_hand_back

    placed.spec["resolved"]["data_yaml"] = "datasets/vision/gone/v1/data.yaml"
    Job.objects.filter(pk=placed.pk).update(spec=placed.spec)
    assert not storage_lost_hand_back(job_id=placed.pk, attempt_id=placed.attempt_id, node_name="node-a")
    assert Job.objects.get(pk=placed.pk).state == "starting"
    assert Node.objects.get(name="node-a").storage_problem == ""


@pytest.mark.django_db(transaction=True)  # finish() closes stale connections
def test_a_dataset_error_while_the_storage_is_gone_requeues_the_job_instead_of_failing_it(placed, settings, tmp_path):
    """The race past the pre-check (or a checkpoint write into a mount that dropped mid-training):
    the child's "dataset YAML not found" is the node's storage, not the job's data."""
    from apps.jobs.models import Job, JobEvent, JobState
    from apps.jobs.services import attempt_start
    from worker.tasks import AttemptRunner, ChildResult

    job = attempt_start(job_id=placed.pk, attempt_id=placed.attempt_id, node_name="node-a")
    runner = AttemptRunner(job)
    settings.DATASETS_DIR = tmp_path / "mountpoint" / "datasets"  # the mount drops as the child starts
    error = {"type": "error", "kind": "data", "message": "dataset YAML not found: demo/data.yaml"}
    assert runner.finish(ChildResult(outcome="failed", exit_code=1, error=error)) == "requeued"
    job = Job.objects.get(pk=placed.pk)
    assert (job.state, job.attempt, job.retries_left) == (JobState.QUEUED, 2, 1)  # no retry spent
    requeued = JobEvent.objects.get(job_id=job.pk, kind="storage_unavailable")
    assert "node-a lost the shared storage while the attempt ran" in requeued.message
    assert "dataset problem" not in requeued.message and "failed" not in kinds(job)
    assert Node.objects.get(name="node-a").storage_problem


@pytest.mark.django_db(transaction=True)  # finish() closes stale connections
def test_the_same_dataset_error_with_the_storage_there_fails_the_job_as_before(placed):
    from apps.jobs.models import Job
    from apps.jobs.services import attempt_start
    from worker.tasks import AttemptRunner, ChildResult

    Job.objects.filter(pk=placed.pk).update(retries_left=0)
    job = attempt_start(job_id=placed.pk, attempt_id=placed.attempt_id, node_name="node-a")
    error = {"type": "error", "kind": "data", "message": "dataset YAML not found: demo/data.yaml"}
    assert AttemptRunner(job).finish(ChildResult(outcome="failed", exit_code=1, error=error)) == "failed"
    assert Job.objects.get(pk=placed.pk).error.startswith("dataset problem: dataset YAML not found")


def test_the_heartbeat_marks_the_node_while_the_storage_is_gone_and_clears_it_when_it_is_back(
        demo_registered, settings, tmp_path):
    from apps.cluster.selectors import cluster_totals
    from apps.scheduling.inputs import cluster_nodes
    from worker.node import Heartbeat

    node = register()
    beat = Heartbeat(node, 1.0, simulated=True)
    beat.beat()
    assert Node.objects.get(name="node-a").storage_problem == ""
    shared = settings.DATASETS_DIR
    settings.DATASETS_DIR = tmp_path / "mountpoint" / "datasets"
    beat.beat()
    node = Node.objects.get(name="node-a")
    assert node.storage_problem and node.state == Node.State.ACTIVE  # an operator's drain is not touched
    (info,) = cluster_nodes(Node.objects.filter(name="node-a"))
    assert (info.schedulable, info.unschedulable_because) == (False, "shared storage unreachable")
    settings.DATASETS_DIR = shared
    beat.beat()
    node = Node.objects.get(name="node-a")
    assert node.storage_problem == ""
    (info,) = cluster_nodes(Node.objects.filter(name="node-a"))
    assert info.schedulable
    assert cluster_totals([{"alive": True, "state": "active", "storage_problem": "x", "gpus": [{"allocated": 0}]}])[
        "gpus_available"] == 0


def test_the_slurm_agent_refuses_to_start_without_the_shared_storage(demo_registered, settings, tmp_path):
    """Its Slurm nodes read inputs and write results at the shared paths: it registered the
    partition anyway, and every job failed there."""
    settings.SLURM_PORTAL_URL = "http://portal.example.com"
    settings.DATASETS_DIR = tmp_path / "login-node" / "datasets"
    with pytest.raises(CommandError) as refused:
        call_command("slurm_agent", "--partition", "gpu")
    assert str(refused.value).startswith("slurm_agent for partition gpu not started: this machine's artifact "
                                         "storage lacks ")
    assert not Node.objects.exists()


class PartitionOfOne:
    """Slurm's answers for a partition of one idle node (the cluster itself is the live suite's)."""

    def __init__(self) -> None:
        self.submitted = []

    def nodes(self, partition):
        from worker.executors.slurm import SlurmNode

        return [SlurmNode(name="gpu01", hostname="gpu01", cpus=8, memory_mb=32768, gpus=1, gpu_model="",
                          state="idle", partitions=(partition,))]

    def jobs(self):
        return []

    def task_plugin(self):
        return "task/cgroup"

    def submit(self, options, script):
        self.submitted.append(script)
        return str(100 + len(self.submitted))


def test_the_slurm_agent_marks_its_nodes_while_the_shared_storage_is_gone_and_clears_them_when_it_is_back(
        demo_registered, settings, tmp_path):
    """Checked at the agent's start only, a mount that dropped later left the partition taking work."""
    from apps.scheduling.inputs import cluster_nodes
    from worker.executors.slurm import SlurmAgent

    settings.SLURM_PORTAL_URL = "http://portal.example.com"
    agent, shared = SlurmAgent("gpu", client=PartitionOfOne()), settings.DATASETS_DIR
    agent.sync_nodes(force=True)
    assert Node.objects.get(name="gpu01").storage_problem == ""

    settings.DATASETS_DIR = tmp_path / "mountpoint" / "datasets"
    agent.sync_nodes(force=True)
    (info,) = cluster_nodes(Node.objects.filter(name="gpu01"))
    assert (info.schedulable, info.unschedulable_because) == (False, "shared storage unreachable")

    settings.DATASETS_DIR = shared
    agent.sync_nodes(force=True)
    (info,) = cluster_nodes(Node.objects.filter(name="gpu01"))
    assert info.schedulable and Node.objects.get(name="gpu01").storage_problem == ""


def test_a_slurm_submit_that_cannot_write_to_a_lost_storage_requeues_the_job_instead_of_failing_it(
        demo_registered, alice, teams, settings, tmp_path):
    from apps.jobs.models import Job, JobState
    from apps.jobs.services import job_claim
    from tests.jobs.factories import make_job
    from worker.executors.slurm import SlurmAgent

    settings.SLURM_PORTAL_URL = "http://portal.example.com"
    client = PartitionOfOne()
    agent = SlurmAgent("gpu", client=client)
    agent.sync_nodes(force=True)
    job = make_job(team=teams["vision"], user=alice, gpus=1, retries_left=0)
    assert job_claim(job, node=Node.objects.get(name="gpu01"), gpu_indices=[0], gpu_share=1.0, run_class="medium")

    (tmp_path / "mountpoint").write_text("")  # what is left of DATA_DIR: no folder can be made under it
    settings.DATASETS_DIR = tmp_path / "mountpoint" / "datasets"
    settings.JOBS_DIR = tmp_path / "mountpoint" / "jobs"
    agent.start_placed()

    job = Job.objects.get(pk=job.pk)
    assert (job.state, job.attempt, job.retries_left, client.submitted) == (JobState.QUEUED, 2, 0, [])
    from apps.jobs.models import JobEvent

    requeued = JobEvent.objects.filter(job=job).latest("seq")
    assert requeued.kind == "storage_unavailable"
    assert requeued.message.startswith("the slurm_agent cannot write to the shared storage (")
    agent.sync_nodes()  # due at once (the next tick): it marks the partition
    assert Node.objects.get(name="gpu01").storage_problem != ""


@pytest.mark.django_db(transaction=True)  # train() and finish() close stale connections, as a work-horse must
def test_a_checkpoint_unloadable_because_the_jobs_mount_dropped_requeues_the_job_and_keeps_the_checkpoint(placed):
    """The pre-start check passed and the mount dropped as the resumed child loaded its checkpoint
    (exit 4): before, the worker took it for the checkpoint's fault, rejected one candidate after
    another (their rows deleted: the job's resume points gone for good) and started over from
    scratch: with the storage really gone that fails the job, a retry spent (review22 #6)."""
    from apps.core.storage_marks import MARKER_NAME
    from apps.jobs.models import Checkpoint, Job, JobEvent, JobState
    from apps.jobs.services import attempt_start
    from apps.scheduling.management.commands.scheduler import Chores
    from tests.jobs.factories import stored_checkpoint
    from worker.tasks import AttemptRunner

    Chores().storage_marks()  # the installation's markers: from now on nodes check them
    job = attempt_start(job_id=placed.pk, attempt_id=placed.attempt_id, node_name="node-a")
    stored_checkpoint(job, 2)  # recorded with its bytes, which Ultralytics cannot load
    (job.run_dir.parent / MARKER_NAME).unlink()  # this node's view: the jobs mount just went
    assert AttemptRunner(job).train() == "requeued"
    job = Job.objects.get(pk=placed.pk)
    assert (job.state, job.attempt, job.retries_left) == (JobState.QUEUED, 2, 1)  # no retry spent
    assert list(Checkpoint.objects.filter(job_id=job.pk).values_list("epoch", flat=True)) == [2]
    assert "checkpoint_rejected" not in kinds(job)
    requeued = JobEvent.objects.get(job_id=job.pk, kind="storage_unavailable")
    assert "node-a lost the shared storage while the attempt ran" in requeued.message
    assert "JOBS_DIR" in Node.objects.get(name="node-a").storage_problem


@pytest.mark.django_db(transaction=True)  # train() and finish() close stale connections, as a work-horse must
def test_a_training_that_succeeds_after_the_jobs_mount_dropped_is_requeued_not_recorded_as_a_success(placed):
    """Its weights went to this node's empty mount point: recorded as a success, the job's weights
    were registered where no other machine and no download finds them."""
    from apps.core.storage_marks import MARKER_NAME
    from apps.jobs.models import Job, JobEvent, JobState
    from apps.jobs.services import attempt_start
    from apps.registry.models import ModelVersion
    from apps.scheduling.management.commands.scheduler import Chores
    from worker.tasks import AttemptRunner

    Chores().storage_marks()
    job = attempt_start(job_id=placed.pk, attempt_id=placed.attempt_id, node_name="node-a")
    (job.run_dir.parent / MARKER_NAME).unlink()  # the jobs mount goes as the training runs
    assert AttemptRunner(job).train() == "requeued"
    job = Job.objects.get(pk=placed.pk)
    assert (job.state, job.attempt, job.retries_left) == (JobState.QUEUED, 2, 1)
    assert "succeeded" not in kinds(job) and not ModelVersion.objects.filter(job_id=job.pk).exists()
    requeued = JobEvent.objects.get(job_id=job.pk, kind="storage_unavailable")
    assert requeued.message.startswith("node node-a lost the shared storage while the attempt ran: shared storage "
                                       "unreachable: JOBS_DIR (no storage marker)")
    assert "JOBS_DIR" in Node.objects.get(name="node-a").storage_problem


@pytest.mark.django_db(transaction=True)  # finish() closes stale connections, as a work-horse must
def test_a_long_preempted_job_that_succeeds_while_the_mount_flickers_is_not_failed(placed):
    """review23: the storage check on a success requeues it within MAX_INFRA_REQUEUES, counted as the
    attempt's number: a job requeued eleven times for the infrastructure's reasons (withdrawn from a
    busy Slurm partition, drains, lost nodes; no retry left) whose training then succeeded while its
    node's mount flickered was failed for good, "lost the shared storage", though nothing of it
    failed. Past that budget the success is recorded, as before the success check."""
    from apps.core.storage_marks import MARKER_NAME
    from apps.jobs.models import Job, JobState
    from apps.jobs.services import attempt_start
    from apps.scheduling.management.commands.scheduler import Chores
    from worker.tasks import AttemptRunner, ChildResult

    Chores().storage_marks()
    job = attempt_start(job_id=placed.pk, attempt_id=placed.attempt_id, node_name="node-a")
    Job.objects.filter(pk=job.pk).update(attempt=12, retries_left=0)  # eleven infrastructure requeues before this one
    job = Job.objects.select_related("node", "team", "user").get(pk=job.pk)
    weights = job.run_dir / "train" / "weights" / "best.pt"
    weights.parent.mkdir(parents=True, exist_ok=True)
    weights.write_bytes(b"weights")
    (job.run_dir.parent / MARKER_NAME).unlink()  # the jobs mount flickers as the attempt ends
    outcome = AttemptRunner(job).finish(ChildResult(outcome="succeeded", exit_code=0,
                                                    finished={"mode": "train", "weights": str(weights)}))
    assert (outcome, Job.objects.get(pk=job.pk).state) == ("succeeded", JobState.SUCCEEDED)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["bad name!", "gpu-07/x", "-gpu", "gpu-07.", "g" * 81])
def test_a_worker_with_a_name_no_node_may_have_refuses_to_start_and_says_the_form(name, demo_registered):
    """``--name 'bad name!'`` registered a node (queue ``node.bad name!``) (optrial24, F13)."""
    with pytest.raises(CommandError) as refused:
        call_command("gpu_worker", f"--name={name}", "--simulate-gpus", "1")
    said = str(refused.value)
    assert said.startswith(f"--name (or NODE_NAME) {name!r} is not a node name: use letters, digits, '-', '_' and '.'")
    assert "at most 80 characters" in said
    assert not Node.objects.exists()


def test_host_names_are_node_names_and_their_zygote_address_fits():
    """Kubernetes gives NODE_NAME the node's DNS name (deploy/kubernetes/worker.yaml): dots are fine."""
    from apps.cluster.models import NODE_NAME_MAX, node_name_problem
    from worker.management.commands.gpu_worker import zygote_address

    for name in ("gpu-07", "GPU_07", "local", "ip-10-0-1-23.eu-west-1.compute.internal", "n" * NODE_NAME_MAX):
        assert node_name_problem(name) == ""
    # Linux holds 107 bytes of an abstract socket's name (after its "@"), pids go up to 4194304.
    assert len(zygote_address("n" * NODE_NAME_MAX, 4194304)) - 1 <= 107
