"""The ``artifacts`` storage on an S3-compatible bucket (``ARTIFACTS_S3_BUCKET``; apps/core/storage.py).

django-storages' ``S3Storage``, plus: an object stored by :func:`apps.core.storage.artifact_upload`
carries the sha256 of its bytes as user metadata (``x-amz-meta-sha256``), so ``artifacts_push``
can tell a file rewritten at the same size from the one already stored without downloading it.

Why not the ETag: it is the MD5 of the bytes only for a single-part upload without SSE-KMS/SSE-C;
boto3 uploads a file over 8 MiB in parts and the ETag is then ``md5(part md5s)-<parts>``, which
depends on the part size the uploader chose (moto_server does the same). User metadata is kept as
written by AWS S3, MinIO, Ceph and moto, and returned by the HEAD the comparison needs anyway.
Kept in its own module: importing boto3 costs every process that only uses a shared DATA_DIR.
"""

from __future__ import annotations

from storages.backends.s3 import S3Storage


class ArtifactS3Storage(S3Storage):
    def _get_write_parameters(self, name, content=None):
        # Gotcha: the only per-object hook django-storages offers, get_object_parameters(name), does
        # not see the content; this one does (tests/core/test_artifacts_push.py checks the metadata).
        params = super()._get_write_parameters(name, content)
        sha256 = getattr(content, "sha256", None)
        if sha256:
            params["Metadata"] = {**params.get("Metadata", {}), "sha256": sha256}
        return params
