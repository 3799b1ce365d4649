from __future__ import annotations

import json

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from apps.core.backup import BackupError, restore
from apps.core.storage_marks import storage_mark_renew


class Command(BaseCommand):
    help = ("Restore a backup folder into this installation's empty database and storage, then migrate "
            "(docs/deploy.md 'Backups').")

    def add_arguments(self, parser):
        parser.add_argument("folder")

    def handle(self, *args, folder, **options):
        try:
            result = restore(folder)
        except BackupError as exc:
            raise CommandError(str(exc)) from None
        call_command("migrate", "--noinput", verbosity=0)
        storage_mark_renew()  # a new installation: its own storage token (apps/core/storage_marks.py)
        self.stdout.write(json.dumps(result))
