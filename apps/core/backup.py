"""Backups of an installation: the database and the artifact storage, and their restore.

A backup is a folder::

    manifest.json        what was taken, when, from which database engine, how many files
    database.sqlite3     SQLite: an online copy (sqlite3's backup API, consistent while others write)
    database.dump        PostgreSQL: ``pg_dump --format=custom`` (consistent snapshot)
    storage/<root>/…     the artifact roots (datasets, jobs, models, weights: apps/core/artifacts.py)
                         on this machine's disk
    store/<root>/…       with an object store (ARTIFACTS_S3_BUCKET): every object of the roots
                         in it, fetched through the storage API (apps/core/storage.py)
    secret_key           the generated SECRET_KEY when there is one (sessions survive the move)

The database is taken first, then the files: rows only name keys (never absolute paths),
and a file written after the dump is harmless extra. Restoring puts the files under the
new installation's roots (wherever its DATA_DIR is) and, when it has an object store, every
object (and every file of the roots the store lacked) into that store — the one the restoring
installation is configured with, not the old one; it loads the database into an empty one;
``migrate`` then brings an older backup up to the code. See docs/deploy.md "Backups".
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

from apps.core.artifacts import ROOTS, ArtifactKeyError, key_check, root_path
from apps.core.storage import (
    StorageUnavailable,
    artifact_forget,
    artifact_listing,
    artifact_read,
    artifact_store_name,
    artifact_upload,
    shared_filesystem,
)


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


def _copy_tree(source: Path, target: Path, root: str = "", vanished: list[str] | None = None) -> int:
    """Copy regular files (hidden in-progress ones skipped: uploads being written, deletions).
    With ``vanished`` (the backup of a live installation's roots), a file removed after its
    folder was listed (a node's finished run folder, a rotated checkpoint) is left out and its
    key added there; without it (restore, reading a backup folder) that is an error."""
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
            try:
                shutil.copy2(src, dst)
            except FileNotFoundError:
                if vanished is None or src.exists():
                    raise
                dst.unlink(missing_ok=True)
                vanished.append(f"{root}/{src.relative_to(source).as_posix()}")
                continue
            count += 1
    return count


def _fetch_store(root: str, target: Path, vanished: list[str]) -> int:
    """Copy every object under ``root`` in the object store into ``target``; how many.

    The backup of a live installation lists a root, then fetches its objects one by one: a job
    training meanwhile stores a checkpoint and deletes its oldest (three are kept), so an object
    listed may be gone when its turn comes, or go while it is read (a big one's ranged GETs come after
    the HEAD: review32). It is left out, no partial file, and named in ``vanished`` (operator trial 31:
    the backup stopped with a FileNotFoundError traceback and no manifest.json)."""
    count = 0
    for key in artifact_listing(root):
        destination = target / key.partition("/")[2]
        destination.parent.mkdir(parents=True, exist_ok=True)
        try:
            source = artifact_read(key)
            with source, open(destination, "wb") as out:
                shutil.copyfileobj(source, out, 1 << 20)
        except FileNotFoundError:
            # Gone before its HEAD, or after it while read (StoredObjectReader's GETs): no partial copy.
            destination.unlink(missing_ok=True)
            vanished.append(key)
            continue
        count += 1
    return count


def _tree_keys(folder: Path, root: str) -> dict[str, Path]:
    """The files of a backup's copy of ``root`` by key (hidden ones aside)."""
    if not folder.is_dir():
        return {}
    return {f"{root}/{path.relative_to(folder).as_posix()}": path for path in sorted(folder.rglob("*"))
            if path.is_file() and not any(part.startswith(".") for part in path.relative_to(folder).parts)}


def _addressable(key: str) -> bool:
    """A local file whose name no key can hold (no row names it) stays out of the store."""
    try:
        key_check(key)
    except ArtifactKeyError:
        return False
    return True


def backup(target: Path) -> dict:
    """Write a backup of this installation into the new folder ``target``."""
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise BackupError(f"{target} is a file: give a new (or empty) folder")
    if target.exists() and any(target.iterdir()):
        raise BackupError(f"{target} is not empty")
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a read-only or missing mount: was a traceback (optrial24)
        raise BackupError(f"cannot make the folder {target}: {exc.strerror or exc}") from None
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
    files, vanished = {}, []
    for root in ROOTS:
        source = root_path(root)
        files[root] = _copy_tree(source, target / "storage" / root, root, vanished) if source.is_dir() else 0
    objects = None
    if not shared_filesystem():
        # With an object store the local roots hold only this machine's copies: the store is where
        # every weights file, checkpoint and log archive lives (multi-node trial, M1).
        try:
            objects = {root: _fetch_store(root, target / "store" / root, vanished) for root in ROOTS}
        except StorageUnavailable as exc:
            raise BackupError(f"{exc}: the backup in {target} is incomplete; run it again into a new folder") from None
    secret = Path(settings.DATA_DIR) / "secret_key"
    if secret.is_file() and not os.environ.get("SECRET_KEY"):
        shutil.copy2(secret, target / "secret_key")
    manifest = {"created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)), "engine": vendor,
                "files": files, "secret_key": (target / "secret_key").exists()}
    if objects is not None:
        manifest |= {"store": artifact_store_name(), "objects": objects}
    if vanished:
        manifest["vanished"] = vanished
    (target / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _database_empty() -> bool:
    """No Django table in it. A SQLite file that is not there is empty, and is not opened: opening
    it would make it, and a refused restore must leave none behind."""
    if connection.vendor == "sqlite" and connection.connection is None \
            and not Path(connection.settings_dict["NAME"]).exists():
        return True
    return "django_migrations" not in connection.introspection.table_names()


def _backup_database_check(source: Path, vendor: str) -> None:
    """The backup's database file is there and, for SQLite, a database manage.py backup wrote: a
    folder without one loaded an empty database and called it restored (and sqlite3 made an empty
    ``database.sqlite3`` in the backup folder to read from)."""
    if vendor != "sqlite":
        if not (source / "database.dump").is_file():
            raise BackupError(f"{source} has no database.dump: the backup is incomplete (or of another engine)")
        return
    path = source / "database.sqlite3"
    if not path.is_file():
        raise BackupError(f"{source} has no database.sqlite3: the backup is incomplete (or of another engine)")
    try:
        # immutable: read as it is, no lock, no -shm or -wal file made beside it.
        reader = sqlite3.connect(f"{path.resolve().as_uri()}?immutable=1", uri=True)
        try:
            tables = {row[0] for row in reader.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            reader.close()
    except sqlite3.DatabaseError as exc:
        raise BackupError(f"{path} is not a SQLite database ({exc})") from None
    if "django_migrations" not in tables:
        raise BackupError(f"{path} is not a database manage.py backup wrote (it has no django_migrations table)")


def _restore_refusal(source: Path, vendor: str) -> None:
    """Every reason to refuse the restore, checked before anything is written (BackupError)."""
    # A typo'd or wrong folder was a FileNotFoundError traceback (optrial24).
    if not source.is_dir():
        raise BackupError(f"{source} is not a folder: give the folder manage.py backup wrote")
    try:
        manifest = json.loads((source / "manifest.json").read_text())
    except FileNotFoundError:
        raise BackupError(f"{source} is not a backup: it has no manifest.json (manage.py backup writes one "
                          "last, so a backup that did not finish has none either)") from None
    except (OSError, ValueError) as exc:
        raise BackupError(f"{source}/manifest.json cannot be read: {exc}") from None
    if not isinstance(manifest, dict) or "engine" not in manifest:
        raise BackupError(f"{source} is not a backup: its manifest.json is not one manage.py backup wrote "
                          "(it names no database engine)")
    if manifest["engine"] != vendor:
        raise BackupError(f"the backup is of a {manifest['engine']} database; this installation uses {vendor}")
    _backup_database_check(source, vendor)
    if not _database_empty():
        raise BackupError("the database is not empty: restore into a fresh one (see docs/deploy.md)")
    for root in ROOTS:
        folder = root_path(root)
        if folder.is_dir() and any(p for p in folder.iterdir() if not p.name.startswith(".")):
            raise BackupError(f"{folder} ({root}) is not empty: restore into a fresh storage")
    if not shared_filesystem():
        try:
            for root in ROOTS:
                if artifact_listing(root):
                    raise BackupError(f"the artifact store {artifact_store_name()} already holds objects under {root}/: "
                                      "restore into an empty bucket")
        except StorageUnavailable as exc:
            raise BackupError(str(exc)) from None


def _missing(path: Path) -> list[Path]:
    """``path`` and those of its folders that are not there, deepest first: what making it makes."""
    return [p for p in (path, *path.parents) if not p.exists()]


def _remove(paths) -> None:
    """Remove files, and folders if empty, in the order given (what a refused restore made)."""
    for path in paths:
        try:
            if path.is_dir() and not path.is_symlink():
                path.rmdir()
            else:
                path.unlink(missing_ok=True)
        except OSError:
            pass  # a folder something else put a file into meanwhile stays


def _sqlite_files(database: Path | None) -> list[Path]:
    if database is None:
        return []
    return [database, *(database.with_name(database.name + end) for end in ("-wal", "-shm", "-journal"))]


def _restore_files(source: Path, uploaded: list[str]) -> tuple[dict, dict]:
    """The backup's files under this installation's roots and, with an object store, into it
    (each key into ``uploaded`` before its upload, so a failure can take them back)."""
    into_store = not shared_filesystem()
    files, objects = {}, {}
    for root in ROOTS:
        stored = source / "storage" / root
        files[root] = _copy_tree(stored, root_path(root)) if stored.is_dir() else 0
        from_store = _tree_keys(source / "store" / root, root)
        if into_store:
            # The store's objects, and the local files it lacked (a filesystem backup moving into a bucket).
            uploads = {key: path for key, path in _tree_keys(stored, root).items() if _addressable(key)} | from_store
            try:
                for key, path in uploads.items():
                    uploaded.append(key)
                    artifact_upload(key, path)
            except StorageUnavailable as exc:
                raise BackupError(str(exc)) from None
            objects[root] = len(uploads)
        elif from_store:  # an object store's backup restored onto a shared filesystem
            objects[root] = _copy_tree(source / "store" / root, root_path(root))
    return files, objects


def _restore_database(source: Path, vendor: str, database: Path | None) -> None:
    connection.close()
    if database is not None:
        database.parent.mkdir(parents=True, exist_ok=True)
        # One transaction of the backup API: a failure leaves the destination as it was.
        backup_db = sqlite3.connect(source / "database.sqlite3")
        destination = sqlite3.connect(database)
        try:
            with destination:
                backup_db.backup(destination)
        finally:
            destination.close()
            backup_db.close()
        return
    result = subprocess.run(["pg_restore", "--no-owner", "--exit-on-error", "--single-transaction", *_pg_args(),
                             str(source / "database.dump")], env=_pg_env(), capture_output=True, text=True)
    if result.returncode != 0:
        raise BackupError(f"pg_restore failed: {result.stderr.strip()}")


def restore(source: Path, *, key_made: tuple[Path, ...] = ()) -> dict:
    """Load the backup folder ``source`` into this (empty) installation.

    A refused restore leaves the installation as it found it (refusals left an empty database
    file and the secret key generated at the command's start in DATA_DIR):

    1. Every check before anything is written (:func:`_restore_refusal`): the folder, its
       manifest, the engine, the backup's database file, an empty database (a SQLite file that
       is not there is not opened: opening it makes it), empty roots and store.
    2. The files, then the store's objects (the step an unreachable store can stop part-way),
       then the database (one transaction: SQLite's backup API, ``pg_restore
       --single-transaction``), then the backup's secret key.
    3. Refused or failed at any step: what the restore wrote is taken back (the roots were
       empty; the objects it uploaded are deleted where the store answers, else the refusal
       counts them), with a database file it made and the key this process generated into
       DATA_DIR at start when the caller passes it as ``key_made`` (``settings.SECRET_KEY_MADE``,
       yoloportal/secret.py): only ``manage.py restore``, which exits right after, does; a
       process that goes on signs with that key (attempt tokens), so it keeps it (review27).
    """
    source = Path(source)
    vendor = connection.vendor
    database = Path(connection.settings_dict["NAME"]) if vendor == "sqlite" else None
    # A database that is there owns its -wal/-shm (whoever has it open made them): only a file
    # this restore makes takes its companions with it (review27).
    made = [path for path in _sqlite_files(database) if not path.exists()] if database and not database.exists() else []
    made += list(key_made)
    was_open = connection.connection is not None
    try:
        _restore_refusal(source, vendor)
    except BaseException:
        if not was_open:  # the check's own connection (closing the caller's would break its transaction)
            connection.close()
        _remove(made)
        raise
    roots = {root: _missing(root_path(root)) for root in ROOTS}
    secret = Path(settings.DATA_DIR) / "secret_key"
    secret_before = secret.read_bytes() if secret.is_file() else None
    uploaded: list[str] = []
    try:
        files, objects = _restore_files(source, uploaded)
        _restore_database(source, vendor, database)
        backup_secret = source / "secret_key"
        if backup_secret.is_file() and not os.environ.get("SECRET_KEY"):
            shutil.copy2(backup_secret, secret)
    except BaseException as exc:
        connection.close()
        left = _restore_take_back(roots, uploaded)
        if secret_before is not None and secret not in made:
            secret.write_bytes(secret_before)
        _remove(made)
        if isinstance(exc, BackupError):
            raise BackupError(f"{exc}: nothing is restored{left}") from None
        raise
    result = {"engine": vendor, "files": files, "database": connection.settings_dict["NAME"]}
    if objects:
        result |= {"store": artifact_store_name(), "objects": objects}
    return result


def _restore_take_back(roots: dict[str, list[Path]], uploaded: list[str]) -> str:
    """Remove what a failed restore put under the roots (each was empty, or not there) and into the
    store; "" or words for the objects that could not be deleted."""
    for root, missing in roots.items():
        folder = root_path(root)
        if missing:
            shutil.rmtree(folder, ignore_errors=True)
            _remove(missing[1:])
        elif folder.is_dir():
            for child in folder.iterdir():
                if child.name.startswith("."):
                    continue  # was there before (the emptiness check passes hidden ones)
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
    if not uploaded:
        return ""
    left = len(uploaded) - artifact_forget(uploaded)
    if not left:
        return ""
    return (f"; {left} objects it uploaded are still in {artifact_store_name()} (under "
            f"{', '.join(f'{root}/' for root in ROOTS)}): empty the bucket before restoring again")
