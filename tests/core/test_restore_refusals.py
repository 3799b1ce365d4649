"""manage.py restore of a folder that is not a backup, and backup into a file or where no folder can
be made: a CommandError saying so, not a FileNotFoundError traceback (optrial24); and a refused
restore leaves the installation as it found it. The whole round trip:
tests/integration/test_backup_restore.py."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError


def test_a_missing_folder_an_empty_one_and_a_bad_manifest_are_refused_in_words(tmp_path):
    with pytest.raises(CommandError, match=r"optrial24-typo is not a folder: give the folder manage.py backup wrote"):
        call_command("restore", str(tmp_path / "optrial24-typo"))
    with pytest.raises(CommandError, match=r"is not a backup: it has no manifest.json"):
        call_command("restore", str(tmp_path))
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(CommandError, match=r"manifest.json cannot be read"):
        call_command("restore", str(tmp_path))


def test_a_backup_onto_a_file_or_where_no_folder_can_be_made_is_refused_in_words(tmp_path):
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(CommandError, match=r"a-file is a file: give a new \(or empty\) folder"):
        call_command("backup", str(tmp_path / "a-file"))
    with pytest.raises(CommandError, match=r"cannot make the folder .*/a-file/below: Not a directory"):
        call_command("backup", str(tmp_path / "a-file" / "below"))


@pytest.mark.parametrize("manifest", ['{"name": "site", "version": "1.0.0"}', "[]", '"x"'])
def test_another_tools_manifest_json_is_refused_in_words(tmp_path, manifest):
    """manifest.json is a common name (web app manifests, npm/asset-pipeline outputs, other backup
    tools): a folder holding someone else's passed the new "has no manifest.json" check and then
    failed with KeyError: 'engine' / TypeError tracebacks at manifest["engine"] (review26)."""
    (tmp_path / "manifest.json").write_text(manifest)
    with pytest.raises(CommandError, match=r"is not a backup|manifest.json cannot be read"):
        call_command("restore", str(tmp_path))


# --- a refused restore leaves the installation as it found it --------------------------------------------
# Run as the operator does, in a process of its own on a fresh DATA_DIR: the secret key is generated
# at settings' import and the database file at its first connection, before restore() decides.


def restore_in(data_dir: Path, folder: Path, **extra: str) -> str:
    """``manage.py restore FOLDER`` on the SQLite installation in ``data_dir`` (``extra``: more
    environment); its refusal."""
    env = {key: value for key, value in os.environ.items()
           if key not in {"SECRET_KEY", "DATABASE_URL", "TEST_DATABASE_PATH", "ARTIFACTS_S3_BUCKET"}
           and not key.endswith("_DIR")}
    result = subprocess.run([sys.executable, "manage.py", "restore", str(folder)], cwd=settings.BASE_DIR,
                            env={**env, "DATA_DIR": str(data_dir), **extra}, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0, result.stdout
    return result.stderr


def tree(folder: Path) -> dict[str, bytes | None] | None:
    """Every file (its bytes) and folder (None) under ``folder``; None when it is not there."""
    if not folder.exists():
        return None
    return {path.relative_to(folder).as_posix(): path.read_bytes() if path.is_file() else None
            for path in sorted(folder.rglob("*"))}


def django_database(path: Path) -> Path:
    """A SQLite file with the table every migrated database has (enough for restore's checks)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE django_migrations (id integer PRIMARY KEY, app text, name text, applied text)")
    return path


@pytest.fixture
def backup_folder(tmp_path) -> Path:
    """A backup as far as restore's checks can tell: a manifest and a Django database."""
    folder = tmp_path / "backup"
    django_database(folder / "database.sqlite3")
    (folder / "manifest.json").write_text(json.dumps({"engine": "sqlite", "files": {}, "secret_key": False}))
    return folder


def test_a_refused_restore_of_what_is_not_a_backup_makes_no_data_folder(tmp_path):
    """Nor a secret key in it, nor a database file (both were left behind)."""
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "manifest.json").write_text('{"name": "site"}')
    for folder, said in ((tmp_path / "typo", "is not a folder"), (tmp_path / "other", "is not a backup")):
        assert said in restore_in(tmp_path / "data", folder)
        assert tree(tmp_path / "data") is None


def test_a_refused_restore_of_another_engines_backup_leaves_the_data_folder_as_it_was(tmp_path, backup_folder):
    (tmp_path / "data").mkdir()
    (backup_folder / "manifest.json").write_text('{"engine": "postgresql"}')
    assert "the backup is of a postgresql database; this installation uses sqlite" in restore_in(
        tmp_path / "data", backup_folder)
    assert tree(tmp_path / "data") == {}


@pytest.mark.parametrize("database, said", [
    (None, "has no database.sqlite3: the backup is incomplete"),
    (b"not a database", "is not a SQLite database"),
    (b"", "is not a database manage.py backup wrote (it has no django_migrations table)"),
])
def test_a_backup_without_a_sound_database_is_refused_and_nothing_is_written(tmp_path, backup_folder, database, said):
    """It loaded an empty database and called it restored; sqlite3 even made the file in the backup."""
    (backup_folder / "database.sqlite3").unlink()
    if database is not None:
        (backup_folder / "database.sqlite3").write_bytes(database)
    before = tree(backup_folder)
    assert said in restore_in(tmp_path / "data", backup_folder)
    assert tree(tmp_path / "data") is None
    assert tree(backup_folder) == before


def test_a_restore_refused_for_a_database_in_use_leaves_it_and_its_key_untouched(tmp_path, backup_folder):
    data = tmp_path / "data"
    with sqlite3.connect(django_database(data / "yoloportal.sqlite3")) as db:
        db.execute("PRAGMA journal_mode=WAL")  # as an installation's own is (yoloportal/env.py)
    (data / "secret_key").write_text("the installation's own")
    before = tree(data)
    assert "the database is not empty" in restore_in(data, backup_folder)
    assert tree(data) == before


def test_a_restore_refused_for_storage_in_use_makes_no_database_file_or_key(tmp_path, backup_folder):
    data = tmp_path / "data"
    (data / "jobs" / "7").mkdir(parents=True)
    assert "(jobs) is not empty: restore into a fresh storage" in restore_in(data, backup_folder)
    assert tree(data) == {"jobs": None, "jobs/7": None}


def test_a_restore_the_store_stops_part_way_takes_back_its_files_and_writes_no_database(tmp_path, backup_folder,
                                                                                         moto):
    """The store came before the database was restored and the roots half full ("empty the database
    and the bucket and restore again"). Now the files, then the objects come first, and a failure
    part-way takes back what it wrote: here the real S3 server (moto) dies once the first of the
    backup's objects has reached it, so the restore also says that the objects it uploaded could
    not be deleted."""
    import threading

    import boto3

    from tests.s3 import stop_moto

    for n in range(300):
        (backup_folder / "storage" / "jobs" / str(n)).mkdir(parents=True)
        (backup_folder / "storage" / "jobs" / str(n) / "log.txt").write_text(f"job {n}")
    s3 = boto3.client("s3", endpoint_url=moto["url"], aws_access_key_id="testing", aws_secret_access_key="testing",
                      region_name="us-east-1")
    stopped = threading.Event()

    def stop_at_the_first_object():
        while not stopped.is_set():
            if s3.list_objects_v2(Bucket=moto["bucket"]).get("KeyCount"):
                stop_moto(moto["process"])
                stopped.set()
            time.sleep(0.005)

    watcher = threading.Thread(target=stop_at_the_first_object, daemon=True)
    watcher.start()
    data = tmp_path / "data"
    try:
        said = restore_in(data, backup_folder, ARTIFACTS_S3_BUCKET=moto["bucket"],
                          ARTIFACTS_S3_ENDPOINT_URL=moto["url"], AWS_ACCESS_KEY_ID="testing",
                          AWS_SECRET_ACCESS_KEY="testing")
    finally:
        stopped.set()
        watcher.join(10)
    assert "nothing is restored" in said and "objects it uploaded are still in s3://" in said, said
    assert "Traceback" not in said, said
    assert tree(data) is None, "no database file, no key, no files: the data folder as it was (not there)"
