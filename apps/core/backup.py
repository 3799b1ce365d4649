"""Backups of an installation: the database and the artifact storage, and their restore.

A backup is a folder::

    manifest.json        what was taken, when, from which database engine, how many files
    database.sqlite3     SQLite: an online copy (sqlite3's backup API, consistent while others write)
    database.dump        PostgreSQL: ``pg_dump --format=custom`` (consistent snapshot)
    storage/<root>/…     the artifact roots (datasets, jobs, models, weights: apps/core/artifacts.py)
    secret_key           the generated SECRET_KEY when there is one (sessions survive the move)

The database is taken first, then the files: rows only name keys (never absolute paths),
and a file written after the dump is harmless extra. Restoring puts the files under the
new installation's roots (wherever its DATA_DIR is) and loads the database into an empty
one; ``migrate`` then brings an older backup up to the code. See docs/deploy.md "Backups".
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path

from django.conf import settings
from django.db import connection

from apps.core.artifacts import ROOTS, root_path


class BackupError(RuntimeError):
    pass


def _pg_env() -> dict[str, str]:
    db = settings.DATABASES["default"]
    env = dict(os.environ)
    if db.get("PASSWORD"):
        env["PGPASSWORD"] = db["PASSWORD"]
    return env


def _pg_args() -> list[str]:
    db = settings.DATABASES["default"]
    args = ["--dbname", db["NAME"]]
    if db.get("HOST"):
        args += ["--host", db["HOST"]]
    if db.get("PORT"):
        args += ["--port", str(db["PORT"])]
    if db.get("USER"):
        args += ["--username", db["USER"]]
    return args


def _copy_tree(source: Path, target: Path) -> int:
    """Copy regular files (hidden in-progress ones skipped: uploads being written, deletions)."""
    count = 0
    for folder, dirs, files in os.walk(source):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            if name.startswith("."):
                continue
            src = Path(folder) / name
            if not src.is_file():
                continue
            dst = target / src.relative_to(source)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
            count += 1
    return count


def backup(target: Path) -> dict:
    """Write a backup of this installation into the new folder ``target``."""
    target = Path(target)
    if target.exists() and any(target.iterdir()):
        raise BackupError(f"{target} is not empty")
    target.mkdir(parents=True, exist_ok=True)
    # Password and token hashes, the audit log, every team's data: the owner's alone (the database
    # copy was 0644 in a 0755 folder beside a 0600 secret_key; manager trial).
    target.chmod(0o700)
    vendor = connection.vendor
    started = time.time()
    if vendor == "sqlite":
        connection.ensure_connection()
        os.close(os.open(target / "database.sqlite3", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        destination = sqlite3.connect(target / "database.sqlite3")
        with destination:
            connection.connection.backup(destination)
        destination.close()
    elif vendor == "postgresql":
        result = subprocess.run(["pg_dump", "--format=custom", "--no-owner", "--file", str(target / "database.dump"),
                                 *_pg_args()], env=_pg_env(), capture_output=True, text=True)
        if result.returncode != 0:
            raise BackupError(f"pg_dump failed: {result.stderr.strip()}")
        (target / "database.dump").chmod(0o600)
    else:
        raise BackupError(f"no backup for the {vendor} database engine")
    files = {}
    for root in ROOTS:
        source = root_path(root)
        files[root] = _copy_tree(source, target / "storage" / root) if source.is_dir() else 0
    secret = Path(settings.DATA_DIR) / "secret_key"
    if secret.is_file() and not os.environ.get("SECRET_KEY"):
        shutil.copy2(secret, target / "secret_key")
    manifest = {"created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)), "engine": vendor,
                "files": files, "secret_key": (target / "secret_key").exists()}
    (target / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _database_empty() -> bool:
    return "django_migrations" not in connection.introspection.table_names()


def restore(source: Path) -> dict:
    """Load the backup folder ``source`` into this (empty) installation."""
    source = Path(source)
    manifest = json.loads((source / "manifest.json").read_text())
    vendor = connection.vendor
    if manifest["engine"] != vendor:
        raise BackupError(f"the backup is of a {manifest['engine']} database; this installation uses {vendor}")
    if not _database_empty():
        raise BackupError("the database is not empty: restore into a fresh one (see docs/deploy.md)")
    for root in ROOTS:
        folder = root_path(root)
        if folder.is_dir() and any(p for p in folder.iterdir() if not p.name.startswith(".")):
            raise BackupError(f"{folder} ({root}) is not empty: restore into a fresh storage")
    if vendor == "sqlite":
        name = Path(settings.DATABASES["default"]["NAME"])
        connection.close()
        backup_db = sqlite3.connect(source / "database.sqlite3")
        destination = sqlite3.connect(name)
        with destination:
            backup_db.backup(destination)
        destination.close()
        backup_db.close()
    else:
        connection.close()
        result = subprocess.run(["pg_restore", "--no-owner", "--exit-on-error", *_pg_args(),
                                 str(source / "database.dump")], env=_pg_env(), capture_output=True, text=True)
        if result.returncode != 0:
            raise BackupError(f"pg_restore failed: {result.stderr.strip()}")
    files = {}
    for root in ROOTS:
        stored = source / "storage" / root
        files[root] = _copy_tree(stored, root_path(root)) if stored.is_dir() else 0
    secret = source / "secret_key"
    if secret.is_file() and not os.environ.get("SECRET_KEY"):
        shutil.copy2(secret, Path(settings.DATA_DIR) / "secret_key")
    return {"engine": vendor, "files": files, "database": settings.DATABASES["default"]["NAME"]}
