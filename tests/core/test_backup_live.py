"""manage.py backup of a live installation: a file or object that goes between the backup's listing
and its copy is what a running job does every epoch (its worker keeps the three newest stored
checkpoints and deletes the older ones; a node removes a finished job's run folder). Operator trial
31 took the documented backup (docs/deploy.md "Upgrades", step 1) with two jobs training on a
real S3 server: it stopped with a FileNotFoundError traceback for
``jobs/<id>/checkpoints/epoch-0029-attempt-1.pt`` and left a folder without manifest.json."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings

from apps.core import backup as backup_module
from tests.s3 import s3_client, s3_storages

# transaction=True: sqlite3's backup API waits forever on a source connection inside the test's open
# write transaction.
pytestmark = pytest.mark.django_db(transaction=True)


def test_an_object_deleted_between_the_listing_and_its_copy_is_left_out_not_a_traceback(
    moto, tmp_path, monkeypatch, capsys
):
    s3 = s3_client(moto["url"])
    kept, rotated = "jobs/j1/checkpoints/epoch-0004-attempt-1.pt", "jobs/j1/checkpoints/epoch-0001-attempt-1.pt"
    for key in (kept, rotated, "datasets/vision/demo/v1/data.yaml"):
        s3.put_object(Bucket=moto["bucket"], Key=key, Body=key.encode())
    listing = backup_module.artifact_listing

    def listed_then_rotated(root):
        keys = listing(root)
        if root == "jobs":  # the training's worker stores a newer checkpoint and drops the oldest
            s3.delete_object(Bucket=moto["bucket"], Key=rotated)
        return keys

    monkeypatch.setattr(backup_module, "artifact_listing", listed_then_rotated)
    folder = tmp_path / "backup"
    with override_settings(STORAGES=s3_storages(moto)):
        call_command("backup", str(folder))
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["objects"] == {"datasets": 1, "jobs": 1, "models": 0, "weights": 0}
    assert manifest["vanished"] == [rotated]
    assert (folder / "store" / kept).read_bytes() == kept.encode()
    assert not (folder / "store" / rotated).exists()
    assert rotated in capsys.readouterr().err


def test_a_file_removed_between_the_walk_and_its_copy_is_left_out_not_a_traceback(tmp_path, monkeypatch):
    run = Path(settings.JOBS_DIR) / "ops31-live" / "checkpoints"
    run.mkdir(parents=True, exist_ok=True)
    (run / "epoch-0002.pt").write_bytes(b"newer")
    gone = run / "epoch-0001.pt"
    gone.write_bytes(b"older")
    copy2 = shutil.copy2

    def removed_while_copied(src, dst, *args, **kwargs):
        if Path(src) == gone:
            gone.unlink()  # the worker's rotation, after the walk listed the file and saw it regular
        return copy2(src, dst, *args, **kwargs)

    monkeypatch.setattr(backup_module.shutil, "copy2", removed_while_copied)
    folder = tmp_path / "backup"
    call_command("backup", str(folder))
    manifest = json.loads((folder / "manifest.json").read_text())
    copied = folder / "storage" / "jobs" / "ops31-live" / "checkpoints"
    assert (copied / "epoch-0002.pt").read_bytes() == b"newer" and not (copied / "epoch-0001.pt").exists()
    assert manifest["vanished"] == ["jobs/ops31-live/checkpoints/epoch-0001.pt"]


def test_an_object_deleted_while_it_is_read_is_left_out_without_a_partial_file(moto, tmp_path, monkeypatch):
    """The reader's HEAD found the object; it was deleted before its ranged GET (a big checkpoint read
    while the worker rotated it): a ClientError NoSuchKey traceback and an empty file left (review32)."""
    s3 = s3_client(moto["url"])
    kept, rotated = "jobs/j1/checkpoints/epoch-0004-attempt-1.pt", "jobs/j1/checkpoints/epoch-0001-attempt-1.pt"
    for key in (kept, rotated):
        s3.put_object(Bucket=moto["bucket"], Key=key, Body=key.encode() * 1000)
    read = backup_module.artifact_read

    def opened_then_rotated(key):
        opened = read(key)  # the HEAD: size and ETag
        if key == rotated:
            s3.delete_object(Bucket=moto["bucket"], Key=rotated)
        return opened

    monkeypatch.setattr(backup_module, "artifact_read", opened_then_rotated)
    folder = tmp_path / "backup"
    with override_settings(STORAGES=s3_storages(moto)):
        call_command("backup", str(folder))
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["vanished"] == [rotated] and manifest["objects"]["jobs"] == 1
    assert (folder / "store" / kept).read_bytes() == kept.encode() * 1000
    assert not (folder / "store" / rotated).exists()
