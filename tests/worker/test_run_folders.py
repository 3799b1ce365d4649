"""A GPU server's own run folders with an object store (worker/artifacts.py): scratch once the
store holds what matters, so a worker starting up removes those of jobs that no longer run
(multi-node trial M6); on a shared filesystem the folder is the store and stays."""

from __future__ import annotations

import pytest
from django.test import override_settings

from tests.jobs.factories import make_job
from tests.s3 import s3_storages
from worker.artifacts import abandoned_run_folders_remove

pytestmark = pytest.mark.django_db


def run_folders(jobs_dir, alice, teams) -> dict:
    """A run folder (a 'checkpoint' in it) for a job in each state, and a folder no job names."""
    folders = {}
    for state in ("succeeded", "failed", "queued", "starting", "running"):
        job = make_job(team=teams["vision"], user=alice, state=state, task_name=state)
        folder = jobs_dir / str(job.pk)
        (folder / "checkpoints").mkdir(parents=True)
        (folder / "checkpoints" / "epoch-0001.pt").write_bytes(b"x" * 1000)
        folders[state] = folder
    folders["operator's"] = jobs_dir / "notes"
    folders["operator's"].mkdir()
    return folders


@pytest.mark.integration
def test_a_starting_worker_removes_the_folders_of_jobs_that_hold_no_gpus(alice, teams, moto, settings, tmp_path):
    settings.JOBS_DIR = tmp_path / "gpu-server" / "jobs"
    folders = run_folders(settings.JOBS_DIR, alice, teams)
    with override_settings(STORAGES=s3_storages(moto)):
        assert abandoned_run_folders_remove() == 3
    assert {name for name, folder in folders.items() if folder.exists()} == {"starting", "running", "operator's"}


@pytest.mark.integration
def test_the_old_shared_data_dir_kept_as_a_node_s_data_dir_after_a_move_to_a_bucket_is_left_alone(
        alice, teams, moto, settings, tmp_path, caplog):
    """Operator trial 29: a GPU server of a shared-filesystem installation moved into a bucket
    (docs/deploy.md, "Moving an existing installation into a bucket") still mounts the old shared
    DATA_DIR. Its worker's first start took that JOBS_DIR for its own scratch and deleted every
    ended job's folder there, results included: whatever `artifacts_push` had not copied (a job
    that ended after it ran) was gone for good. A root holding the scheduler's storage marker is
    the old shared storage, never a node's scratch."""
    settings.JOBS_DIR = tmp_path / "shared" / "jobs"
    folders = run_folders(settings.JOBS_DIR, alice, teams)
    (settings.JOBS_DIR / ".yoloportal-storage").write_text("token-of-the-filesystem-installation\n")
    with override_settings(STORAGES=s3_storages(moto)):
        assert abandoned_run_folders_remove() == 0
    assert all(folder.exists() for folder in folders.values())
    assert "left alone" in caplog.text and str(settings.JOBS_DIR) in caplog.text


def test_on_the_shared_filesystem_no_run_folder_is_touched(alice, teams, settings, clean_storage):
    folders = run_folders(settings.JOBS_DIR, alice, teams)
    assert abandoned_run_folders_remove() == 0
    assert all(folder.exists() for folder in folders.values())
