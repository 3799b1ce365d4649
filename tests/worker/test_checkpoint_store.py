"""Resume checkpoints through the artifact store (worker/checkpoint_store.py): on a shared
filesystem a checkpoint's key is its own file; with an object store (a real moto_server) the
attempt's uploader stores the newest one and records its key, older ones leave the store, and
another node fetches it, checked, into its own run folder. (The live version — a worker killed
on one node, the job resumed on another — is tests/integration/test_storage_nodes.py.)"""

from __future__ import annotations

import hashlib
import json
import os
import time

import boto3
import pytest
from django.test import override_settings

from apps.core.artifacts import artifact_path
from apps.jobs.models import Checkpoint, Job, JobEvent
from apps.jobs.services import attempt_event_record, attempt_start, job_claim
from tests.integration.live import wait_for
from tests.jobs.factories import make_job
from tests.s3 import s3_storages, stop_moto
from worker.checkpoint_store import (
    CheckpointUploader,
    best_restore,
    checkpoint_fetch,
    checkpoint_key,
    uploads_checkpoints,
)
from worker.tasks import AttemptRunner

pytestmark = pytest.mark.django_db


@pytest.fixture
def running(alice, teams, node, settings, tmp_path):
    settings.JOBS_DIR = tmp_path / "node-a" / "jobs"
    job = make_job(team=teams["vision"], user=alice, gpus=1, retries_left=1)
    assert job_claim(job, node=node, gpu_indices=[0], gpu_share=1.0, run_class="medium")
    return attempt_start(job_id=job.pk, attempt_id=Job.objects.get(pk=job.pk).attempt_id, node_name="node-a")


def write_checkpoint(job: Job, epoch: int, size: int = 200_000, best: bool = False) -> tuple[str, str]:
    """What the child does at an epoch's end (worker/train_child.copy_checkpoint), and its event."""
    path = job.run_dir / "checkpoints" / f"epoch-{epoch:04d}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(size))
    sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
    attempt_event_record(job, {"type": "checkpoint", "epoch": epoch, "path": str(path), "sha256": sha256,
                               "size": size, "best": best})
    return str(path), sha256


def bucket_keys(moto) -> list[str]:
    store = boto3.client("s3", endpoint_url=moto["url"], aws_access_key_id="testing",
                         aws_secret_access_key="testing", region_name="us-east-1")
    return sorted(o["Key"] for o in store.list_objects_v2(Bucket=moto["bucket"]).get("Contents", []))


def test_on_a_shared_filesystem_a_checkpoint_s_key_is_its_own_file(running):
    path, _ = write_checkpoint(running, 1, size=10)
    key = Checkpoint.objects.get(job=running, epoch=1).key
    assert key == f"jobs/{running.pk}/checkpoints/epoch-0001.pt"
    assert str(artifact_path(key)) == path
    assert not uploads_checkpoints(running)  # nothing to copy
    runner = AttemptRunner(running)
    assert runner.uploader is None
    assert runner.checkpoint_local(Checkpoint.objects.get(job=running, epoch=1)) == (artifact_path(key), "")


def rejections(job: Job) -> list[str]:
    return list(JobEvent.objects.filter(job_id=job.pk, kind="checkpoint_rejected").order_by("seq")
                .values_list("message", flat=True))


def test_a_checkpoint_pruned_behind_a_newer_one_is_forgotten_without_an_event(running):
    """The child's keep-N retention deleted epoch 1's file after reporting epoch 4, and its worker
    was killed before the next checkpoint_record removed the row (chaos21)."""
    paths = {epoch: write_checkpoint(running, epoch, size=10)[0] for epoch in (1, 2, 3, 4)}
    os.unlink(paths[1])
    runner = AttemptRunner(Job.objects.get(pk=running.pk))
    assert [c.epoch for c in runner.verified_checkpoints()] == [4, 3, 2]
    assert rejections(running) == []
    assert sorted(Checkpoint.objects.filter(job=running).values_list("epoch", flat=True)) == [2, 3, 4]


def test_a_resume_that_falls_back_says_whether_the_newest_was_deleted_or_corrupt(running):
    paths = {epoch: write_checkpoint(running, epoch, size=10)[0] for epoch in (1, 2, 3)}
    os.unlink(paths[3])
    with open(paths[2], "r+b") as f:
        f.truncate(4)
    runner = AttemptRunner(Job.objects.get(pk=running.pk))
    assert [c.epoch for c in runner.verified_checkpoints()] == [1]
    assert rejections(running) == [
        "checkpoint of epoch 3 is no longer on this node (its file was deleted); falling back to the checkpoint "
        "of epoch 1",
        "checkpoint of epoch 2 is corrupt (its size or hash is not the recorded one); falling back to the "
        "checkpoint of epoch 1",
    ]
    os.unlink(paths[1])
    assert AttemptRunner(Job.objects.get(pk=running.pk)).verified_checkpoints() == []
    assert rejections(running)[-1] == ("checkpoint of epoch 1 is no longer on this node (its file was deleted); "
                                       "no older checkpoint left: starting over")


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)  # the uploader's thread writes through its own connection
def test_the_newest_checkpoints_are_stored_and_another_node_fetches_one(running, moto, settings, tmp_path):
    with override_settings(STORAGES=s3_storages(moto)):
        assert uploads_checkpoints(running)
        uploader = CheckpointUploader(running)
        for epoch in (1, 2, 3, 4):
            path, sha256 = write_checkpoint(running, epoch)
            assert Checkpoint.objects.get(job=running, epoch=epoch).key == ""  # only on this node so far
            uploader.offer(epoch=epoch, path=path, sha256=sha256)
            wait_for(lambda e=epoch: Checkpoint.objects.exclude(key="").filter(job=running, epoch=e).exists(),
                     timeout=60, what=f"epoch {epoch} to be stored")
        uploader.close(lambda: "")
        # Stored under a key naming the attempt; the three newest are kept, the older one left the store.
        stored = dict(Checkpoint.objects.filter(job=running).exclude(key="").values_list("epoch", "key"))
        assert stored[4] == checkpoint_key(running, 4) == f"jobs/{running.pk}/checkpoints/epoch-0004-attempt-1.pt"
        assert sorted(stored) == [2, 3, 4]
        assert not Checkpoint.objects.filter(job=running, epoch=1).exists()
        assert bucket_keys(moto) == sorted(stored.values())

        # Another GPU server: its own DATA_DIR, nothing of node A's disk.
        settings.JOBS_DIR = tmp_path / "node-b" / "jobs"
        settings.ARTIFACTS_CACHE_DIR = tmp_path / "node-b" / "cache"
        newest = Checkpoint.objects.get(job=running, epoch=4)
        runner = AttemptRunner(Job.objects.get(pk=running.pk))
        assert [c.epoch for c in runner.verified_checkpoints()] == sorted(stored, reverse=True)
        local, stop = runner.checkpoint_local(newest)
        assert stop == "" and local == tmp_path / "node-b" / "jobs" / str(running.pk) / "checkpoints" / "epoch-0004.pt"
        assert hashlib.sha256(local.read_bytes()).hexdigest() == newest.sha256
        # The sidecar the child checks before loading it (train_child.inspect_checkpoint).
        assert json.loads(local.with_suffix(".json").read_text()) == {"epoch": 4, "sha256": newest.sha256,
                                                                      "size": newest.size}
        assert not any(p.is_file() for p in (tmp_path / "node-b" / "cache").rglob("*"))  # moved, not doubled

        # Bytes that are not the recorded ones are never resumed from.
        local.unlink()
        Checkpoint.objects.filter(pk=newest.pk).update(sha256="0" * 64)
        assert checkpoint_fetch(running, Checkpoint.objects.get(pk=newest.pk)) is None


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)  # the uploader's thread writes through its own connection
def test_a_checkpoint_replaced_on_disk_before_its_upload_is_not_recorded(running, moto):
    with override_settings(STORAGES=s3_storages(moto)):
        path, sha256 = write_checkpoint(running, 1)
        uploader = CheckpointUploader(running)
        uploader.offer(epoch=1, path=path, sha256="f" * 64)  # the event of bytes since replaced
        uploader.close(lambda: "")
        assert Checkpoint.objects.get(job=running, epoch=1).key == ""
        assert bucket_keys(moto) == []


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)  # the uploader's thread writes through its own connection
def test_while_the_store_is_down_the_attempt_ends_without_a_stored_checkpoint(running, moto):
    with override_settings(STORAGES=s3_storages(moto)):
        stop_moto(moto["process"])
        path, sha256 = write_checkpoint(running, 1)
        uploader = CheckpointUploader(running)
        uploader.offer(epoch=1, path=path, sha256=sha256)
        started = time.monotonic()
        uploader.close(lambda: "")  # one more try, not a wait for the store
        assert time.monotonic() - started < 60
        assert Checkpoint.objects.get(job=running, epoch=1).key == ""


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_best_pt_is_kept_in_the_store_and_restored_on_another_node(running, moto, settings, tmp_path):
    """Ultralytics wrote epoch 2 as best.pt too: that checkpoint outlives the newest three, and a
    resume elsewhere puts it back as best.pt (else a moved job would end with last.pt)."""
    with override_settings(STORAGES=s3_storages(moto)):
        uploader = CheckpointUploader(running)
        best_sha256 = ""
        for epoch in (1, 2, 3, 4, 5):
            path, sha256 = write_checkpoint(running, epoch, best=epoch == 2)
            best_sha256 = sha256 if epoch == 2 else best_sha256
            uploader.offer(epoch=epoch, path=path, sha256=sha256)
            wait_for(lambda e=epoch: Checkpoint.objects.exclude(key="").filter(job=running, epoch=e).exists(),
                     timeout=60, what=f"epoch {epoch} to be stored")
        uploader.close(lambda: "")
        assert sorted(Checkpoint.objects.filter(job=running).values_list("epoch", flat=True)) == [2, 3, 4, 5]

        settings.JOBS_DIR = tmp_path / "node-b" / "jobs"
        settings.ARTIFACTS_CACHE_DIR = tmp_path / "node-b" / "cache"
        assert best_restore(running, 5)
        best = tmp_path / "node-b" / "jobs" / str(running.pk) / "train" / "weights" / "best.pt"
        assert hashlib.sha256(best.read_bytes()).hexdigest() == best_sha256
        assert not best_restore(running, 5)  # already there
        assert not best_restore(running, 1)  # no best at or before epoch 1


@pytest.mark.integration
def test_an_ended_job_s_stored_checkpoints_leave_the_store_as_the_retention_rule_says(alice, teams, moto):
    """A succeeded job's at the next housekeeping run; a failed/cancelled/timed-out one's only
    CHECKPOINT_RETENTION_DAYS after it ended (0 keeps them); a running job's never."""
    from datetime import timedelta

    from django.utils import timezone

    from apps.core.storage import artifact_save_bytes
    from apps.jobs.checkpoint_retention import checkpoints_housekeeping
    from tests.s3 import free_port

    ended = timezone.now() - timedelta(days=2)
    jobs = {name: make_job(team=teams["vision"], user=alice, state=state, task_name=name,
                           finished_at=None if state == "running" else ended)
            for name, state in (("succeeded", "succeeded"), ("cancelled", "cancelled"), ("failed", "failed"),
                                ("running", "running"))}
    with override_settings(STORAGES=s3_storages(moto)):
        for job in jobs.values():
            for epoch in (1, 2):
                key = f"jobs/{job.pk}/checkpoints/epoch-{epoch:04d}-attempt-1.pt"
                artifact_save_bytes(key, f"{job.task_name} {epoch}".encode())
                Checkpoint.objects.create(job=job, attempt=1, epoch=epoch, path=f"/node-a/{epoch}.pt", sha256="0",
                                          size=9, key=key, best=epoch == 1)

        def left() -> set[str]:
            return {key.split("/")[1] for key in bucket_keys(moto)}

        def named(*names: str) -> set[str]:
            return {str(jobs[name].pk) for name in names}

        down = s3_storages({**moto, "url": f"http://127.0.0.1:{free_port()}"})
        with override_settings(STORAGES=down):  # unreachable: nothing goes, it says so
            assert checkpoints_housekeeping()["storage_unavailable"]
        assert Checkpoint.objects.count() == 8 and len(bucket_keys(moto)) == 8

        # (override_settings, not the settings fixture, inside an override_settings block: the
        # fixture's undo would restore this block's STORAGES into the tests after this one.)
        with override_settings(CHECKPOINT_RETENTION_DAYS=0):  # the default: kept forever unless it succeeded
            assert checkpoints_housekeeping() == {"jobs": 1, "deleted": 2, "storage_unavailable": False,
                                              "orphan_prefixes": 0, "orphan_objects": 0}
        assert left() == named("cancelled", "failed", "running")
        assert not Checkpoint.objects.filter(job=jobs["succeeded"]).exists()

        with override_settings(CHECKPOINT_RETENTION_DAYS=3):  # they ended 2 days ago
            assert checkpoints_housekeeping()["jobs"] == 0
        assert left() == named("cancelled", "failed", "running")

        with override_settings(CHECKPOINT_RETENTION_DAYS=1):
            assert checkpoints_housekeeping() == {"jobs": 2, "deleted": 4, "storage_unavailable": False,
                                              "orphan_prefixes": 0, "orphan_objects": 0}
        assert left() == named("running")
        assert set(Checkpoint.objects.values_list("job_id", flat=True)) == {jobs["running"].pk}


def orphaned_checkpoint_job(alice, teams):
    """A succeeded job whose rows name two stored checkpoints, and a third object under its
    checkpoints prefix that no row names (its node died while uploading it: trial M8)."""
    from apps.core.storage import artifact_save_bytes

    job = make_job(team=teams["vision"], user=alice, state="succeeded", task_name="orphan")
    for epoch in (1, 2, 3):
        key = f"jobs/{job.pk}/checkpoints/epoch-{epoch:04d}-attempt-1.pt"
        artifact_save_bytes(key, f"epoch {epoch}".encode())
        if epoch < 3:
            Checkpoint.objects.create(job=job, attempt=1, epoch=epoch, path=f"/node-a/{epoch}.pt", sha256="0",
                                      size=7, key=key)
    return job


@pytest.mark.integration
def test_retention_deletes_a_stored_checkpoint_no_row_names_with_the_job_s_others(alice, teams, moto):
    from apps.jobs.checkpoint_retention import checkpoints_housekeeping

    with override_settings(STORAGES=s3_storages(moto)):
        orphaned_checkpoint_job(alice, teams)
        assert len(bucket_keys(moto)) == 3
        assert checkpoints_housekeeping() == {"jobs": 1, "deleted": 3, "storage_unavailable": False,
                                              "orphan_prefixes": 0, "orphan_objects": 0}
        assert bucket_keys(moto) == []


def test_retention_deletes_an_unnamed_checkpoint_file_on_the_shared_filesystem(alice, teams, clean_storage):
    from apps.jobs.checkpoint_retention import checkpoints_housekeeping

    job = orphaned_checkpoint_job(alice, teams)
    folder = artifact_path(f"jobs/{job.pk}/checkpoints")
    assert len(list(folder.iterdir())) == 3
    assert checkpoints_housekeeping() == {"jobs": 1, "deleted": 3, "storage_unavailable": False,
                                              "orphan_prefixes": 0, "orphan_objects": 0}
    assert list(folder.iterdir()) == []


def test_retention_deletes_the_sidecars_on_the_shared_filesystem_without_calling_them_orphans(
        alice, teams, clean_storage, caplog):
    """Each checkpoint file on the shared filesystem has its sidecar (epoch-NNNN.json) beside it,
    which no row names: retention deletes it with its checkpoint and logs no "upload cut short"
    line for it (optrial24: every succeeded job's housekeeping did)."""
    from apps.jobs.checkpoint_retention import checkpoints_housekeeping

    job = make_job(team=teams["vision"], user=alice, state="succeeded", task_name="sidecars")
    folder = artifact_path(f"jobs/{job.pk}/checkpoints")
    folder.mkdir(parents=True)
    for epoch in (1, 2):
        key = f"jobs/{job.pk}/checkpoints/epoch-{epoch:04d}.pt"
        artifact_path(key).write_bytes(b"weights")
        artifact_path(key).with_suffix(".json").write_text(json.dumps({"epoch": epoch, "sha256": "0", "size": 7}))
        Checkpoint.objects.create(job=job, attempt=1, epoch=epoch, path=str(artifact_path(key)), sha256="0",
                                  size=7, key=key)
    with caplog.at_level("INFO", logger="apps.jobs.checkpoint_retention"):
        assert checkpoints_housekeeping() == {"jobs": 1, "deleted": 4, "storage_unavailable": False,
                                              "orphan_prefixes": 0, "orphan_objects": 0}
    assert list(folder.iterdir()) == []
    assert "no row names" not in caplog.text


def orphan_prefixes(alice, teams) -> dict[str, str]:
    """Objects under jobs/<id>/ of a job with no row (its checkpoint cut short, its weights), of a
    job that has its row, and under a folder no job id names."""
    import uuid

    from apps.core.storage import artifact_save_bytes

    job = make_job(team=teams["vision"], user=alice, state="running", task_name="has-a-row")
    prefixes = {"no row": f"jobs/{uuid.uuid4()}", "has a row": f"jobs/{job.pk}", "not a job": "jobs/notes"}
    for prefix in prefixes.values():
        artifact_save_bytes(f"{prefix}/checkpoints/epoch-0027-attempt-1.pt", b"cut short")
        artifact_save_bytes(f"{prefix}/train/weights/best.pt", b"weights")
    return prefixes


def assert_orphan_prefix_removed_after_a_day(prefixes: dict[str, str], listing) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from apps.jobs.checkpoint_retention import checkpoints_housekeeping

    everything = {name: listing(prefix) for name, prefix in prefixes.items()}
    assert all(len(keys) == 2 for keys in everything.values()), everything
    # Written moments ago: a job's row may not be committed yet. Kept.
    assert checkpoints_housekeeping()["orphan_prefixes"] == 0
    assert {name: listing(prefix) for name, prefix in prefixes.items()} == everything
    done = checkpoints_housekeeping(now=timezone.now() + timedelta(hours=25))
    assert (done["orphan_prefixes"], done["orphan_objects"]) == (1, 2)
    assert {name: listing(prefix) for name, prefix in prefixes.items()} == {**everything, "no row": []}


@pytest.mark.integration
def test_retention_removes_a_day_old_prefix_of_a_job_that_has_no_row_from_the_object_store(alice, teams, moto):
    """Multi-node trial M8's leftover: retention was driven by rows, so a job without any kept its objects."""
    with override_settings(STORAGES=s3_storages(moto)):
        prefixes = orphan_prefixes(alice, teams)
        assert_orphan_prefix_removed_after_a_day(
            prefixes, lambda prefix: [key for key in bucket_keys(moto) if key.startswith(prefix + "/")])


def test_retention_removes_a_day_old_folder_of_a_job_that_has_no_row_on_the_shared_filesystem(
        alice, teams, clean_storage):
    prefixes = orphan_prefixes(alice, teams)
    hidden = artifact_path(prefixes["no row"]) / "checkpoints" / ".epoch-0028.partial"
    hidden.write_bytes(b"")
    assert_orphan_prefix_removed_after_a_day(
        prefixes, lambda prefix: sorted(path.name for path in artifact_path(prefix).rglob("*.pt")))
    assert not artifact_path(prefixes["no row"]).exists(), "its folders and hidden files go too"


def test_a_corrupt_checkpoint_behind_the_one_resumed_from_is_said_dropped_not_fallen_back_from(running):
    """Epoch 3 usable, epoch 2 corrupt: the attempt resumes from epoch 3, yet the event said it
    fell back to epoch 1 (review22)."""
    paths = {epoch: write_checkpoint(running, epoch, size=10)[0] for epoch in (1, 2, 3)}
    with open(paths[2], "r+b") as f:
        f.truncate(4)
    runner = AttemptRunner(Job.objects.get(pk=running.pk))
    assert [c.epoch for c in runner.verified_checkpoints()] == [3, 1]
    assert rejections(running) == ["checkpoint of epoch 2 is corrupt (its size or hash is not the recorded one); "
                                   "dropped; the attempt resumes from the newer checkpoint of epoch 3"]


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)  # the uploader's thread writes through its own connection
def test_a_preempted_attempt_that_stopped_at_its_epoch_end_stores_that_checkpoint_before_it_reports_its_stop(
        running, moto):
    """review22, 4: the next attempt waits for attempt_stopped to resume from the victim's epoch end,
    on another node through the store; abandoning the upload (as a fenced attempt does) lost it."""
    from django.utils import timezone

    from apps.jobs.services import attempt_preempt
    from worker.tasks import ChildResult

    with override_settings(STORAGES=s3_storages(moto)):
        runner = AttemptRunner(Job.objects.get(pk=running.pk))
        assert runner.uploader is not None
        assert attempt_preempt(Job.objects.get(pk=running.pk), reason="an urgent job", now=timezone.now(), grace_s=30)
        path = running.run_dir / "checkpoints" / "epoch-0002.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(200_000))
        result = ChildResult()
        runner.on_event({"type": "checkpoint", "epoch": 2, "path": str(path), "size": 200_000,
                         "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}, result)
        runner.on_event({"type": "stopped", "epoch": 2, "reason": "stop_file"}, result)
        result.outcome, result.exit_code = "fenced", 5
        assert runner.finish(result) == "fenced"
        assert Checkpoint.objects.get(job=running, epoch=2).key == checkpoint_key(running, 2)
        assert JobEvent.objects.filter(job=running, kind="attempt_stopped", attempt=1).exists()
