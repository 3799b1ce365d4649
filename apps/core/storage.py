"""Artifact storage beyond one disk: Django's storage API under the name ``artifacts``.

Rows hold keys (apps/core/artifacts.py). Where the bytes of a key live is the
``artifacts`` storage (``settings.STORAGES``):

- by default :class:`ArtifactFileSystemStorage`: the key's file under its root setting
  (``DATASETS_DIR``, ``JOBS_DIR``, ``MODELS_DIR``, ``WEIGHTS_DIR``), exactly where
  :func:`apps.core.artifacts.artifact_path` puts it — a shared ``DATA_DIR``;
- with ``ARTIFACTS_S3_BUCKET`` set: django-storages' ``S3Storage`` on that bucket (any
  S3-compatible store: ``ARTIFACTS_S3_ENDPOINT_URL``; credentials from the usual
  ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``), the key as the object name, each object
  uploaded with its sha256 as metadata (apps/core/s3_storage.py).

:func:`artifact_local` gives a process a local file for a key: the file itself on a
shared filesystem, else a copy fetched into the node-local cache
``ARTIFACTS_CACHE_DIR/<sha256[:2]>/<sha256>/<name>``, keyed by the content hash recorded
on the row and checked against it. :func:`artifact_upload` stores a local file under a
key and returns its sha256. Errors of an unreachable store come out as
:class:`StorageUnavailable`, so callers can wait and retry instead of failing a job.

Used by the GPU worker (worker/artifacts.py: inputs in, results out; worker/checkpoint_store.py:
resume checkpoints), the web's uploads (datasets, weights: stored before the request answers) and
downloads (apps/registry/api.py ``verified_open``); docs/deploy.md "Storage beyond one disk" says what
does not go through the store yet.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import re
import tempfile
from pathlib import Path

from django.conf import settings
from django.core.files import File
from django.core.files.storage import FileSystemStorage, storages

from apps.core.artifacts import ROOTS, artifact_path, key_check
from apps.core.hashing import file_sha256


class StorageUnavailable(RuntimeError):
    """The artifact store cannot be reached (network, credentials, the service down)."""


class ArtifactChanged(RuntimeError):
    """A fetched artifact does not have the sha256 recorded for it."""


class ArtifactFileSystemStorage(FileSystemStorage):
    """Keys → files under their root settings; saving a key again replaces its file."""

    def __init__(self, **kwargs):
        kwargs.setdefault("allow_overwrite", True)
        kwargs.setdefault("location", settings.DATA_DIR)
        super().__init__(**kwargs)

    def path(self, name: str) -> str:
        return str(artifact_path(name.rstrip("/")))  # listdir("jobs/<id>/checkpoints/"): a folder key


def artifact_storage():
    return storages["artifacts"]


def shared_filesystem() -> bool:
    """True when every process reads the artifacts' files directly (one shared DATA_DIR)."""
    return isinstance(artifact_storage(), FileSystemStorage)


def artifact_store_name() -> str:
    """Where the artifacts live, for messages: ``s3://<bucket>`` (at its endpoint) or ``DATA_DIR``'s roots."""
    storage = artifact_storage()
    if isinstance(storage, FileSystemStorage):
        return "the roots under DATA_DIR"
    endpoint = getattr(storage, "endpoint_url", None)
    return f"s3://{storage.bucket_name}" + (f" at {endpoint}" if endpoint else "")


def _unavailable(exc: BaseException) -> bool:
    try:
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:  # pragma: no cover - django-storages[s3] is a requirement
        return isinstance(exc, OSError)
    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return status >= 500 or code in {"SlowDown", "ServiceUnavailable", "RequestTimeout", "InvalidAccessKeyId",
                                         "SignatureDoesNotMatch", "AccessDenied", "NoSuchBucket"}
    return isinstance(exc, (BotoCoreError, ConnectionError, TimeoutError))


def _problem(exc: BaseException) -> str:
    """An unreachable store's error as an operator can act on it: a missing bucket says so (boto's
    "NoSuchBucket … the specified bucket does not exist" read as an outage; multi-node trial M3)."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict) and response.get("Error", {}).get("Code") == "NoSuchBucket":
        storage = artifact_storage()  # the bucket asked for, as the storage has it (settings may differ)
        bucket, endpoint = getattr(storage, "bucket_name", ""), getattr(storage, "endpoint_url", None)
        return (f"the bucket {bucket!r} does not exist{f' at {endpoint}' if endpoint else ''}: create it first "
                f"(e.g. `aws s3 mb s3://{bucket}` or `mc mb`), see docs/deploy.md")
    return str(exc)


def cache_path(sha256: str, name: str) -> Path:
    return Path(settings.ARTIFACTS_CACHE_DIR) / sha256[:2] / sha256 / name


def artifact_local(key: str, sha256: str) -> Path:
    """A local file with the bytes of ``key`` (checked against ``sha256``).

    ``sha256`` "" (a row from before its hash was recorded): fetched afresh and kept under the
    hash its bytes have, which the caller then records.
    """
    key_check(key)
    if shared_filesystem():
        return artifact_path(key)
    name = key.rsplit("/", 1)[-1]
    if sha256:
        target = cache_path(sha256, name)
        if target.is_file():
            return target
        staging = target.parent
    else:
        staging = Path(settings.ARTIFACTS_CACHE_DIR)
    staging.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    handle, temporary = tempfile.mkstemp(dir=staging, prefix=".fetch-")
    try:
        with os.fdopen(handle, "wb") as out:
            try:
                with _stored_open(key) as source:
                    while block := source.read(1 << 20):
                        digest.update(block)
                        out.write(block)
            except FileNotFoundError:
                raise
            except Exception as exc:
                if _unavailable(exc):
                    raise StorageUnavailable(f"artifact storage unreachable fetching {key}: {_problem(exc)}") from exc
                raise
        if sha256 and digest.hexdigest() != sha256:
            raise ArtifactChanged(f"{key}: sha256 {digest.hexdigest()} in storage, {sha256} recorded")
        target = cache_path(digest.hexdigest(), name)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(temporary, target)  # atomic: a reader sees the whole file or none
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    return target


def artifact_upload(key: str, local: Path) -> str:
    """Store the local file ``local`` under ``key``; returns its sha256."""
    key_check(key)
    sha256 = file_sha256(local)
    storage = artifact_storage()
    if isinstance(storage, FileSystemStorage) and Path(storage.path(key)).resolve() == Path(local).resolve():
        return sha256  # already in place on the shared filesystem
    try:
        with open(local, "rb") as handle:
            content = File(handle, name=key)
            content.sha256 = sha256  # stored with the object (apps/core/s3_storage.py)
            stored = storage.save(key, content)
    except Exception as exc:
        if _unavailable(exc):
            raise StorageUnavailable(f"artifact storage unreachable storing {key}: {_problem(exc)}") from exc
        raise
    if stored != key:  # pragma: no cover - both backends overwrite
        raise RuntimeError(f"storage renamed {key} to {stored}")
    return sha256


def artifact_stored(key: str) -> tuple[int, str, str] | None:
    """(size, sha256 recorded with it or "", MD5 of its bytes or "") of the object stored under
    ``key`` in an object store, from one HEAD; None when there is none. The sha256 is "" for an
    object stored without it (by a version before apps/core/s3_storage.py, or by hand). The MD5 is
    its ETag where that is one: a single-part upload not encrypted with a customer or KMS key (a
    multipart ETag ends in ``-<parts>``; an SSE-C/SSE-KMS ETag is no MD5 of the bytes), else ""."""
    key_check(key)
    try:
        opened = artifact_storage().open(key, "rb")
    except FileNotFoundError:
        return None
    except Exception as exc:
        if _unavailable(exc):
            raise StorageUnavailable(f"artifact storage unreachable reading {key}: {_problem(exc)}") from exc
        raise
    try:
        if not hasattr(opened, "obj"):  # a local file: nothing recorded beside it
            return opened.size, "", ""
        obj = opened.obj
        etag = (obj.e_tag or "").strip('"').lower()
        md5 = etag if (_MD5.fullmatch(etag) and obj.server_side_encryption != "aws:kms"
                       and not obj.sse_customer_algorithm) else ""
        return obj.content_length, (obj.metadata or {}).get("sha256", ""), md5
    finally:
        opened.close()  # (an S3File fetched nothing: it downloads on its first read)


_MD5 = re.compile(r"[0-9a-f]{32}")


def artifact_record_sha256(key: str, *, sha256: str, md5: str) -> bool:
    """Record ``sha256`` with the object under ``key`` in an object store, which an older push
    stored without it, so a later comparison reads it instead of hashing the file for its MD5
    again (artifacts_push; review30). Copied onto itself server side (no bytes travel), with the
    same write parameters an upload gets and its other metadata and content type kept, only while
    its ETag is still ``md5``: False when the object changed since (or is gone; the caller then
    uploads the file over it), else True.
    Single-part objects only (the ETag that is an MD5), so under S3's 5 GiB copy limit."""
    from types import SimpleNamespace

    key_check(key)
    storage = artifact_storage()
    try:
        opened = storage.open(key, "rb")
        try:
            obj = opened.obj
            params = storage._get_write_parameters(key, SimpleNamespace(sha256=sha256, content_type=obj.content_type))
            params["Metadata"] = {**(obj.metadata or {}), **params.get("Metadata", {})}
            copied = obj.copy_from(CopySource={"Bucket": obj.bucket_name, "Key": obj.key},
                                   CopySourceIfMatch=f'"{md5}"', MetadataDirective="REPLACE", **params)
        finally:
            opened.close()
    except FileNotFoundError:
        return False
    except Exception as exc:
        if _unavailable(exc):
            raise StorageUnavailable(f"artifact storage unreachable recording the sha256 of {key}: {_problem(exc)}") \
                from exc
        code = str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))
        if code in ("PreconditionFailed", "412", "NoSuchKey", "404"):
            return False
        raise
    # Gotcha: moto ignores x-amz-copy-source-if-match (AWS, MinIO and Ceph honour it), so the
    # copy's own ETag is checked too: another MD5 means other bytes were stamped with this sha256,
    # and the False makes artifacts_push upload the file over them (bytes and hash right again).
    return (copied.get("CopyObjectResult", {}).get("ETag") or "").strip('"').lower() == md5


def artifact_copy(source: str, target: str, *, sha256: str) -> None:
    """Store the bytes of ``source`` under ``target`` as well, checked against ``sha256``.

    FileNotFoundError when ``source`` is gone, ArtifactChanged when its bytes are not the
    recorded ones (``target`` is then removed again), StorageUnavailable.
    """
    local = artifact_local(source, sha256)
    if not local.is_file():
        raise FileNotFoundError(source)
    try:
        if artifact_upload(target, local) != sha256:  # the shared filesystem's artifact_local does not hash
            artifact_delete(target)
            raise ArtifactChanged(f"{source}: its bytes are not the sha256 {sha256} recorded")
    finally:
        if not shared_filesystem():
            local.unlink(missing_ok=True)  # fetched only to be copied: this process's cache would keep it


def artifact_folder_upload(key: str, folder: Path) -> int:
    """Store every file under ``folder`` (hidden ones aside) under ``key/<relative path>``;
    returns how many. Nothing to copy on the shared filesystem (the folder is the key's)."""
    key_check(key)
    if shared_filesystem():
        return 0
    count = 0
    for path in sorted(Path(folder).rglob("*")):
        relative = path.relative_to(folder)
        if not path.is_file() or any(part.startswith(".") for part in relative.parts):
            continue
        artifact_upload(f"{key}/{relative.as_posix()}", path)
        count += 1
    return count


def artifact_save_bytes(key: str, blob: bytes) -> None:
    """Store ``blob`` under ``key``, replacing what was there."""
    from django.core.files.base import ContentFile

    key_check(key)
    storage = artifact_storage()
    try:
        if isinstance(storage, FileSystemStorage) and storage.exists(key):
            storage.delete(key)
        storage.save(key, ContentFile(blob, name=key))
    except Exception as exc:
        if _unavailable(exc):
            raise StorageUnavailable(f"artifact storage unreachable storing {key}: {_problem(exc)}") from exc
        raise


class StoredObjectReader(io.RawIOBase):
    """An object in an S3-compatible store as a seekable binary file whose bytes are fetched
    as they are read (one ranged GET from the position on, kept open while reading goes on).

    Gotcha: django-storages' ``S3File`` downloads the *whole* object on its first ``read``,
    ``seek`` or ``tell`` into a ``SpooledTemporaryFile`` that, with ``AWS_S3_MAX_MEMORY_SIZE``
    at its default 0, never moves to disk: fetching 64 MiB grew the heap by 72 MiB (1 GB of
    weights: 1 GB of the web process's or the GPU worker's memory), and ``FileResponse`` seeks
    to the end for Content-Length. Spooled to disk (``AWS_S3_MAX_MEMORY_SIZE``) it still
    downloads everything before the first byte goes out, s3transfer's parallel parts holding
    ~20 MiB. Here memory is the block asked for (4 MiB at most fetching 64 or 160 MiB); ``seek(0, SEEK_END)`` and back fetches nothing, so
    ``FileResponse`` gets its Content-Length from :attr:`size`. Each GET is ``If-Match`` the
    ETag seen when opened: an object replaced in the middle of a read fails the read instead
    of mixing two versions. (tests/core/test_storage.py, the large-object test.)
    """

    def __init__(self, stored) -> None:
        super().__init__()
        self._object = stored.obj  # the boto3 Object of an S3File, already loaded (HEAD: size, ETag)
        self.name = stored.name
        self.size = self._object.content_length
        self._position = 0
        self._body = None  # the open GET's stream, at self._body_position
        self._body_position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._position = base + offset
        return self._position

    def readinto(self, buffer) -> int:
        if self.closed:
            raise ValueError("I/O operation on closed file.")
        if self._position >= self.size or not len(buffer):
            return 0
        if self._body is None or self._body_position != self._position:
            self._drop_body()
            self._body = self._get_from(self._position)
            self._body_position = self._position
        data = self._body.read(len(buffer))
        if not data:
            raise OSError(f"{self.name}: the store ended the object at {self._position} of {self.size} bytes")
        buffer[:len(data)] = data
        self._position += len(data)
        self._body_position = self._position
        return len(data)

    def _get_from(self, position: int):
        """The GET's stream from ``position`` on. An object deleted since the HEAD (a training's worker
        rotating its checkpoints while a backup reads them) is a FileNotFoundError, as a missing local
        file is: it was botocore's ClientError NoSuchKey, which the backup did not take for "vanished"
        (review32)."""
        from botocore.exceptions import ClientError

        try:
            return self._object.get(Range=f"bytes={position}-", IfMatch=self._object.e_tag)["Body"]
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                raise FileNotFoundError(errno.ENOENT, "deleted from the store while it was read", self.name) from exc
            raise

    def _drop_body(self) -> None:
        if self._body is not None:
            self._body.close()
            self._body = None

    def close(self) -> None:
        self._drop_body()
        super().close()


def _stored_open(key: str):
    """``key`` opened for reading: the file itself, or a :class:`StoredObjectReader` for an object store."""
    opened = artifact_storage().open(key, "rb")
    if not hasattr(opened, "obj"):  # not an S3File: a local file, read as it is
        return opened
    opened.close()  # (nothing was fetched: an S3File downloads on its first read)
    return StoredObjectReader(opened)


def artifact_read(key: str):
    """An open binary file of ``key`` from storage (the web streams downloads from it), read
    from the store block by block as it is read here (:class:`StoredObjectReader`)."""
    key_check(key)
    try:
        return _stored_open(key)
    except FileNotFoundError:
        raise
    except Exception as exc:
        if _unavailable(exc):
            raise StorageUnavailable(f"artifact storage unreachable reading {key}: {_problem(exc)}") from exc
        raise


def artifact_listing(prefix: str) -> list[str]:
    """Every key under the folder key ``prefix`` (or a whole root: ``"jobs"``) in the store
    (hidden names left out)."""
    if prefix not in ROOTS:
        key_check(prefix)
    storage, keys, folders = artifact_storage(), [], [prefix]
    try:
        while folders:
            folder = folders.pop()
            subfolders, files = storage.listdir(folder + "/")
            keys += [f"{folder}/{name}" for name in files if not name.startswith(".")]
            folders += [f"{folder}/{name.strip('/')}" for name in subfolders if not name.startswith(".")]
    except FileNotFoundError:
        return sorted(keys)  # the shared filesystem: no such folder
    except Exception as exc:
        if _unavailable(exc):
            raise StorageUnavailable(f"artifact storage unreachable listing {prefix}: {_problem(exc)}") from exc
        raise
    return sorted(keys)


def artifact_delete(key: str) -> None:
    """Delete ``key`` from storage (absent is fine); StorageUnavailable while it cannot be reached."""
    key_check(key)
    try:
        artifact_storage().delete(key)
    except Exception as exc:
        if _unavailable(exc):
            raise StorageUnavailable(f"artifact storage unreachable deleting {key}: {_problem(exc)}") from exc
        raise


def artifact_forget(keys: list[str], *, folders: list[str] = ()) -> int:
    """Delete ``keys`` and every key under ``folders`` from an object store; how many went.

    Nothing on the shared filesystem (the callers remove those files themselves). For a row
    already deleted: an unreachable store is logged, not raised — the objects stay behind.
    """
    import logging

    if shared_filesystem():
        return 0
    count = 0
    try:
        for key in [*keys, *(k for folder in folders for k in artifact_listing(folder))]:
            artifact_delete(key)
            count += 1
    except StorageUnavailable as exc:
        logging.getLogger(__name__).warning("objects left in the artifact store (delete them by hand): %s", exc)
    return count
