"""The job's folder is the training child's to write (a container job runs the team's own image),
so the worker must not read, truncate or write another team's files through a link the child
planted there (sec21, F2).

Before: the worker stored as the job's log whatever ``output.log`` pointed at (another team's
data.yaml), emptied it when the log was full (``os.truncate`` follows links), wrote the next
run's config through a planted ``config-2.json`` link, and appended the next attempt's output
through a planted ``attempt-N`` folder link.
"""

from __future__ import annotations

import json
import os

import pytest

from apps.jobs.models import Job, JobState
from tests.jobs.factories import make_job
from worker.executors.base import EventReader, LogReader, NotOwnFile, own_file_create
from worker.tasks import AttemptRunner

SECRET = b"names: [vision-secret-class]\npath: /data/datasets/vision/secret\n"


@pytest.fixture
def vision_file(tmp_path):
    """A file of another team's, somewhere the worker can read and write."""
    path = tmp_path / "datasets" / "vision" / "secret" / "v1" / "data.yaml"
    path.parent.mkdir(parents=True)
    path.write_bytes(SECRET)
    return path


@pytest.fixture
def attempt_dir(tmp_path):
    folder = tmp_path / "jobs" / "robotics-job" / "attempt-1"
    folder.mkdir(parents=True)
    return folder


def test_a_log_linked_to_another_teams_file_is_not_read(attempt_dir, vision_file):
    reader = LogReader(attempt_dir / "output.log")
    (attempt_dir / "output.log").symlink_to(vision_file)

    assert reader.read(final=True) == ""


def test_a_full_log_linked_to_another_teams_file_does_not_empty_it(attempt_dir, vision_file):
    reader = LogReader(attempt_dir / "output.log")
    (attempt_dir / "output.log").symlink_to(vision_file)

    reader.truncate()

    assert vision_file.read_bytes() == SECRET


def test_a_hard_link_to_another_teams_file_is_not_read(attempt_dir, vision_file):
    reader = LogReader(attempt_dir / "output.log")
    os.link(vision_file, attempt_dir / "output.log")

    assert reader.read(final=True) == ""


def test_an_attempt_folder_swapped_for_a_link_is_not_read_through(attempt_dir, vision_file):
    """The child replaces its whole attempt folder while it runs."""
    reader = LogReader(attempt_dir / "output.log")
    events = EventReader(attempt_dir / "events-1.jsonl")
    (vision_file.parent / "output.log").write_text("vision's training output\n")
    (vision_file.parent / "events-1.jsonl").write_text(json.dumps({"type": "epoch", "epoch": 1}) + "\n")
    attempt_dir.rename(attempt_dir.with_name("gone"))
    attempt_dir.symlink_to(vision_file.parent)

    assert reader.read(final=True) == "" and events.read() == []


def test_an_events_file_linked_elsewhere_is_not_read(attempt_dir, tmp_path):
    other = tmp_path / "other-events.jsonl"
    other.write_text(json.dumps({"type": "finished", "weights": "/elsewhere/best.pt"}) + "\n")
    (attempt_dir / "events-1.jsonl").symlink_to(other)

    assert EventReader(attempt_dir / "events-1.jsonl").read() == []


def test_a_pipe_does_not_hang_the_worker(attempt_dir):
    os.mkfifo(attempt_dir / "output.log")

    assert LogReader(attempt_dir / "output.log").read(final=True) == ""


def test_the_worker_replaces_a_planted_link_instead_of_writing_through_it(attempt_dir, vision_file):
    (attempt_dir / "config-2.json").symlink_to(vision_file)

    with os.fdopen(own_file_create(attempt_dir / "config-2.json", folder=attempt_dir.resolve()), "w") as f:
        f.write("{}")

    assert vision_file.read_bytes() == SECRET
    assert not (attempt_dir / "config-2.json").is_symlink() and (attempt_dir / "config-2.json").read_text() == "{}"


def test_the_worker_writes_nothing_into_a_swapped_folder(attempt_dir, vision_file):
    folder = attempt_dir.resolve()
    attempt_dir.rename(attempt_dir.with_name("gone"))
    attempt_dir.symlink_to(vision_file.parent)
    (vision_file.parent / "config-2.json").write_text("vision's")

    with pytest.raises(NotOwnFile):
        own_file_create(attempt_dir / "config-2.json", folder=folder)

    assert (vision_file.parent / "config-2.json").read_text() == "vision's"


def test_own_files_still_read_and_truncate(attempt_dir):
    reader = LogReader(attempt_dir / "output.log")
    (attempt_dir / "output.log").write_text("epoch 1\nepoch 2\n")
    (attempt_dir / "events-1.jsonl").write_text(json.dumps({"type": "epoch", "epoch": 1}) + "\n")

    assert reader.read() == "epoch 1\nepoch 2\n"
    assert EventReader(attempt_dir / "events-1.jsonl").read() == [{"type": "epoch", "epoch": 1}]
    reader.truncate()
    assert (attempt_dir / "output.log").read_bytes() == b""


@pytest.mark.django_db
def test_a_planted_attempt_folder_link_is_replaced_before_the_worker_writes_its_config(
        teams, carol, node, settings, tmp_path, vision_file):
    """The child of attempt 1 leaves ``attempt-2`` → another team's folder for the next attempt."""
    settings.JOBS_DIR = tmp_path / "jobs"
    job = make_job(team=teams["robotics"], user=carol, node=node, gpu_indices=[0], state=JobState.RUNNING, attempt=2)
    spec = {**job.spec, "resolved": {"model": "yolov8n.yaml", "data_yaml": "/data/demo/data.yaml"}}
    Job.objects.filter(pk=job.pk).update(spec=spec)
    job = Job.objects.select_related("node").get(pk=job.pk)
    job.run_dir.mkdir(parents=True)
    (job.run_dir / "attempt-2").symlink_to(vision_file.parent)

    runner = AttemptRunner(job)
    config = runner.child_config(1, None)

    assert not (job.run_dir / "attempt-2").is_symlink()
    assert config.resolve().is_relative_to(job.run_dir.resolve())
    assert sorted(p.name for p in vision_file.parent.iterdir()) == ["data.yaml"]


def test_the_worker_creates_nothing_in_a_swapped_folder(attempt_dir, vision_file):
    folder = attempt_dir.resolve()
    attempt_dir.rename(attempt_dir.with_name("gone"))
    attempt_dir.symlink_to(vision_file.parent)

    with pytest.raises(NotOwnFile):
        own_file_create(attempt_dir / "stop-after-epoch", folder=folder, append=True)

    assert sorted(p.name for p in vision_file.parent.iterdir()) == ["data.yaml"]


@pytest.mark.django_db
def test_results_upload_stores_no_link_the_child_left_in_its_folder(moto, settings, tmp_path, vision_file):
    """With an object store the GPU server uploads the job's folder: a link in it stored another
    team's file under this job's key, to be served as its prediction image (sec21, F3)."""
    import boto3
    from django.test import override_settings

    from tests.s3 import s3_storages
    from worker.artifacts import results_upload

    settings.JOBS_DIR = tmp_path / "jobs"
    settings.DATASETS_DIR = vision_file.parents[3]
    run_dir = settings.JOBS_DIR / "0b7e4c1e-robotics"
    (run_dir / "predict").mkdir(parents=True)
    (run_dir / "predict" / "00000.jpg").write_bytes(b"robotics image")
    (run_dir / "predict" / "00001.jpg").symlink_to(vision_file)
    (run_dir / "stolen").symlink_to(vision_file.parent, target_is_directory=True)

    with override_settings(STORAGES=s3_storages(moto)):
        assert results_upload(run_dir) == 1

    store = boto3.client("s3", endpoint_url=moto["url"], aws_access_key_id="testing",
                         aws_secret_access_key="testing", region_name="us-east-1")
    keys = [o["Key"] for o in store.list_objects_v2(Bucket=moto["bucket"]).get("Contents", [])]
    assert keys == ["jobs/0b7e4c1e-robotics/predict/00000.jpg"]


@pytest.mark.django_db
def test_restoring_best_pt_writes_nothing_through_a_planted_link(teams, carol, settings, tmp_path, vision_file):
    """Before resuming, the worker copies the best checkpoint back to ``best.pt`` through a
    temporary name an earlier child could have made a link to another team's file (sec21, F5)."""
    from tests.jobs.factories import stored_checkpoint
    from worker.checkpoint_store import best_restore

    settings.JOBS_DIR = tmp_path / "jobs"
    job = make_job(team=teams["robotics"], user=carol, state=JobState.RUNNING)
    data = stored_checkpoint(job, 3, best=True)
    weights = job.run_dir / "train" / "weights"
    weights.mkdir(parents=True)
    (weights / ".best.pt.restore").symlink_to(vision_file)

    assert best_restore(job, 3)

    assert vision_file.read_bytes() == SECRET
    assert (weights / "best.pt").read_bytes() == data and not (weights / "best.pt").is_symlink()


def test_the_job_folder_is_scrubbed_of_links_and_pipes_once_the_child_is_gone(tmp_path, vision_file):
    """Everything that later reads, copies, uploads, archives into or deletes from the folder
    (results upload, the log archive, checkpoint retention, resume) then meets only the job's
    own files and folders (sec21, F6)."""
    from worker.artifacts import run_folder_scrub

    run_dir = tmp_path / "jobs" / "robotics-job"
    (run_dir / "train" / "weights").mkdir(parents=True)
    (run_dir / "train" / "weights" / "best.pt").write_bytes(b"robotics")
    (run_dir / "logs").symlink_to(vision_file.parent, target_is_directory=True)
    (run_dir / "train" / "weights" / "last.pt").symlink_to(vision_file)
    os.mkfifo(run_dir / "train" / "pipe")

    assert run_folder_scrub(run_dir) == 3

    assert sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*")) == [
        "train", "train/weights", "train/weights/best.pt"]
    assert vision_file.read_bytes() == SECRET and sorted(p.name for p in vision_file.parent.iterdir()) == ["data.yaml"]


@pytest.mark.django_db
def test_the_worker_scrubs_the_job_folder_before_an_attempt(teams, carol, node, settings,
                                                                                tmp_path, vision_file):
    settings.JOBS_DIR = tmp_path / "jobs"
    job = make_job(team=teams["robotics"], user=carol, node=node, gpu_indices=[0], state=JobState.RUNNING)
    job.run_dir.mkdir(parents=True)
    (job.run_dir / "checkpoints").symlink_to(vision_file.parent, target_is_directory=True)

    AttemptRunner(Job.objects.select_related("node").get(pk=job.pk))

    assert (job.run_dir / "checkpoints").is_dir() and not (job.run_dir / "checkpoints").is_symlink()
    assert sorted(p.name for p in vision_file.parent.iterdir()) == ["data.yaml"]


@pytest.mark.django_db
def test_a_checkpoint_outside_the_jobs_folder_is_not_offered_for_upload(teams, carol, node, settings, tmp_path,
                                                                       vision_file):
    """attempt_event_record ignored it, but the uploader still stored the outside file under the
    job's checkpoint key (then deleted it: the reported sha256 did not match)."""
    from worker.tasks import ChildResult

    settings.JOBS_DIR = tmp_path / "jobs"
    job = make_job(team=teams["robotics"], user=carol, node=node, gpu_indices=[0], state=JobState.RUNNING)
    runner = AttemptRunner(Job.objects.select_related("node").get(pk=job.pk))
    offered = []
    runner.uploader = type("Recorder", (), {"offer": lambda self, **kw: offered.append(kw)})()

    runner.on_event({"type": "checkpoint", "epoch": 1, "path": str(vision_file), "sha256": "0" * 64, "size": 1},
                    ChildResult())

    assert offered == []
