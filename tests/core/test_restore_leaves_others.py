"""A refused restore must not take back what it did not make.

1. The -wal/-shm beside a SQLite database that was there at the start belong to that database
   (to whichever process has it open), not to the restore: restore() put them in ``made`` because
   they were absent when it started, and deleted them on refusal. A web/scheduler/worker process
   that opened the database while the restore checked it loses its committed writes (and the
   next connection makes a new -shm beside the old one's mapping).
2. SECRET_KEY_MADE is what *settings' import* made; a process that goes on running after a
   refused in-process ``call_command("restore")`` (the test session itself, on a fresh
   var/test/gwN) has its key file deleted under it, and every process it starts afterwards
   (web, scheduler, worker: same DATA_DIR) generates another key.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from django.conf import settings

from tests.core.test_restore_refusals import backup_folder, django_database  # noqa: F401 - fixture


def _run(script: str, data_dir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items()
           if key not in {"SECRET_KEY", "DATABASE_URL", "TEST_DATABASE_PATH", "ARTIFACTS_S3_BUCKET",
                          "PYTEST_VERSION", "PYTEST_XDIST_WORKER"}
           and not key.endswith("_DIR")}
    return subprocess.run([sys.executable, "-c", script, *args], cwd=settings.BASE_DIR, capture_output=True,
                          text=True, timeout=120,
                          env={**env, "DATA_DIR": str(data_dir), "DJANGO_SETTINGS_MODULE": "yoloportal.settings"})


WRITER_DURING_THE_CHECK = r"""
import sqlite3, sys
import django
django.setup()
from django.db import connection
from apps.core import backup

held = []
checked = backup._database_empty

def another_process_writes_meanwhile():
    empty = checked()
    # The web process (CONN_MAX_AGE 60) opens the database and commits a row while the restore looks.
    writer = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute("INSERT INTO django_migrations (app, name, applied) VALUES ('web', 'committed meanwhile', 'now')")
    held.append(writer)
    return empty

backup._database_empty = another_process_writes_meanwhile
try:
    backup.restore(sys.argv[1])
except backup.BackupError as exc:
    print("refused:", exc)
reader = sqlite3.connect(connection.settings_dict["NAME"])
try:
    print("rows", reader.execute("SELECT count(*) FROM django_migrations WHERE name = 'committed meanwhile'").fetchone()[0])
except sqlite3.Error as exc:  # seen: "disk I/O error" (the -shm the writer maps is gone)
    print("reader:", exc)
"""


def test_a_refused_restore_keeps_the_wal_of_a_database_another_process_has_open(tmp_path, backup_folder):  # noqa: F811
    data = tmp_path / "data"
    database = django_database(data / "yoloportal.sqlite3")
    import sqlite3

    with sqlite3.connect(database) as db:
        db.execute("PRAGMA journal_mode=WAL")
    db.close()
    (data / "secret_key").write_text("the installation's own")
    assert not (data / "yoloportal.sqlite3-wal").exists()  # every connection closed: checkpointed away
    result = _run(WRITER_DURING_THE_CHECK, data, str(backup_folder))
    assert "refused: the database is not empty" in result.stdout, result.stdout + result.stderr
    assert "rows 1" in result.stdout, (
        "the row another process committed is gone or the database unreadable: the refused restore "
        f"deleted the database's -wal and -shm while that process had it open\n{result.stdout}{result.stderr}")


KEY_OF_A_PROCESS_THAT_GOES_ON = r"""
import sys
from pathlib import Path
import django
django.setup()
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError

try:
    call_command("restore", sys.argv[1])
except CommandError as exc:
    print("refused:", exc)
key = Path(settings.DATA_DIR) / "secret_key"
print("key file", "kept" if key.is_file() and key.read_text().strip() == settings.SECRET_KEY else "gone")
"""


def test_an_in_process_refusal_keeps_the_key_the_running_process_signs_with(tmp_path):
    """As the test session does (tests/core/test_restore_refusals.py calls restore in-process) on a
    fresh var/test/gwN: the session goes on with SECRET_KEY, the web/scheduler/worker processes it
    starts later read DATA_DIR/secret_key, which the refusal deleted, and make another."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "yoloportal.sqlite3").touch()  # not the point here
    result = _run(KEY_OF_A_PROCESS_THAT_GOES_ON, data, str(tmp_path / "typo"))
    assert "refused:" in result.stdout, result.stdout + result.stderr
    assert "key file kept" in result.stdout, result.stdout + result.stderr
