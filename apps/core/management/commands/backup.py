from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from apps.core.backup import BackupError, backup


class Command(BaseCommand):
    help = "Back up the database and the artifact storage into a new folder (docs/deploy.md 'Backups')."

    def add_arguments(self, parser):
        parser.add_argument("folder")

    def handle(self, *args, folder, **options):
        try:
            manifest = backup(folder)
        except BackupError as exc:
            raise CommandError(str(exc)) from None
        if manifest.get("vanished"):
            # Deleted by the running installation after the backup listed them (a job's older
            # checkpoints, a finished run folder): not an error, but the operator should know.
            self.stderr.write(
                f"left out {len(manifest['vanished'])} file(s) deleted while the backup ran "
                f"(the installation is live; rows dumped before may still name them): "
                + ", ".join(manifest["vanished"])
            )
        self.stdout.write(json.dumps(manifest))
