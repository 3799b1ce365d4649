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
        self.stdout.write(json.dumps(manifest))
