from __future__ import annotations

import os
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from apps.core.artifacts import ROOTS, ArtifactKeyError, artifact_key, root_path
from apps.core.storage import StorageUnavailable, artifact_storage, artifact_upload, shared_filesystem


class Command(BaseCommand):
    help = ("Copy every artifact file under this machine's roots (DATASETS_DIR, JOBS_DIR, MODELS_DIR, WEIGHTS_DIR) "
            "into the configured artifact storage, by key: how an existing DATA_DIR moves into S3 "
            "(docs/deploy.md 'Storage'). Files already stored with the same size are skipped.")

    def add_arguments(self, parser):
        parser.add_argument("--dry-run", action="store_true")

    def handle(self, *args, dry_run=False, **options):
        if shared_filesystem():
            raise CommandError("the artifact storage is this filesystem (set ARTIFACTS_S3_BUCKET): nothing to push")
        storage = artifact_storage()
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
                        if storage.exists(key) and storage.size(key) == path.stat().st_size:
                            skipped += 1
                            continue
                        if not dry_run:
                            artifact_upload(key, path)
                    except StorageUnavailable as exc:
                        raise CommandError(str(exc)) from None
                    pushed += 1
        self.stdout.write(f"{'would push' if dry_run else 'pushed'} {pushed} files, {skipped} already stored")
