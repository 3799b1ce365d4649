from __future__ import annotations

import os
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from apps.core.artifacts import ROOTS, ArtifactKeyError, artifact_key, root_path
from apps.core.hashing import file_md5_and_sha256, file_sha256
from apps.core.storage import (
    StorageUnavailable,
    artifact_record_sha256,
    artifact_stored,
    artifact_upload,
    shared_filesystem,
)


class Command(BaseCommand):
    help = ("Copy every artifact file under this machine's roots (DATASETS_DIR, JOBS_DIR, MODELS_DIR, WEIGHTS_DIR) "
            "into the configured artifact storage, by key: how an existing DATA_DIR moves into S3 "
            "(docs/deploy.md 'Storage'). A file already stored with the same bytes (the sha256 recorded with "
            "the object) is skipped: run it again and it copies only what changed.")

    def add_arguments(self, parser):
        parser.add_argument("--dry-run", action="store_true")

    def handle(self, *args, dry_run=False, **options):
        if shared_filesystem():
            raise CommandError("the artifact storage is this filesystem (set ARTIFACTS_S3_BUCKET): nothing to push")
        pushed = skipped = 0
        for root in ROOTS:
            base = root_path(root)
            for folder, dirs, files in os.walk(base):
                dirs[:] = [d for d in dirs if not d.startswith(".")]
                for name in files:
                    path = Path(folder) / name
                    if name.startswith(".") or not path.is_file():
                        continue
                    try:
                        key = artifact_key(path)
                    except ArtifactKeyError:
                        self.stderr.write(f"skipped {path}: not a valid artifact key")
                        continue
                    try:
                        if self.stored_alike(key, path):
                            skipped += 1
                            continue
                        if not dry_run:
                            artifact_upload(key, path)
                    except StorageUnavailable as exc:
                        raise CommandError(str(exc)) from None
                    pushed += 1
        self.stdout.write(f"{'would push' if dry_run else 'pushed'} {pushed} files, {skipped} already stored")
        self.warn_active()

    @staticmethod
    def stored_alike(key: str, path: Path) -> bool:
        """The object under ``key`` has the bytes of ``path``: same size and the same sha256 recorded
        with it at upload (apps/core/s3_storage.py). The size alone let a file rewritten at the same
        size (best.pt/last.pt of one architecture between epochs) stay stale in the bucket (operator
        trial 29). An object without a recorded hash (an older push) is compared by its ETag where
        that is the MD5 of its bytes (a single-part upload: boto3 makes one up to 8 MiB; see
        artifact_stored), else copied again, once (a multipart one: weights files). An object skipped
        by its ETag gets the sha256 recorded then (copied onto itself, server side), so the next
        pass compares that and no MD5 again (left31). A re-run costs one HEAD per file and a local
        read of the files whose size matches; no download."""
        stored = artifact_stored(key)
        if stored is None or stored[0] != path.stat().st_size:
            return False
        size, sha256, md5 = stored
        if sha256:
            return sha256 == file_sha256(path)
        if not md5:
            return False
        local_md5, local_sha256 = file_md5_and_sha256(path)
        # Changed since the HEAD (its ETag no longer the one compared): copied as any other.
        return local_md5 == md5 and artifact_record_sha256(key, sha256=local_sha256, md5=md5)

    def warn_active(self) -> None:
        """A job still starting or running writes files this pass did not see (operator trial 29: the
        stack restarted on the bucket resumed such a job from the last checkpoint the push had copied,
        35 epochs back; one that ended meanwhile would have had its results on the old DATA_DIR only)."""
        from django.apps import apps

        # apps.core imports no other app (tests/test_architecture.py): the model by name, and the
        # states that hold GPUs (apps.jobs.models.HOLDING_STATES) spelled out.
        active = apps.get_model("jobs", "Job").objects.filter(state__in=("starting", "running")).order_by("pk")
        count = active.count()
        if not count:
            return
        named = ", ".join(str(pk)[:8] for pk in active.values_list("pk", flat=True)[:10]) + (", …" if count > 10 else "")
        self.stderr.write(
            f"warning: {count} job{' is' if count == 1 else 's are'} starting or running ({named}): what they write "
            "from now on, and any upload made before the restart, is not in the bucket. Stop the web, the scheduler, "
            "the notification and GPU workers, run artifacts_push again (it copies only what changed), then start "
            "everything with the new settings (docs/deploy.md)")
