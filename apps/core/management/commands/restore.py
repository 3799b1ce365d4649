from __future__ import annotations

import json

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from apps.core.backup import BackupError, restore
from apps.core.storage_marks import storage_mark_renew


class Command(BaseCommand):
    help = ("Restore a backup folder into this installation's empty database and storage, then migrate "
            "(docs/deploy.md 'Backups').")

    def add_arguments(self, parser):
        parser.add_argument("folder")

    # Run as `manage.py restore` (not call_command), the process ends with the command: only then
    # does a refusal take back the secret key this process generated at start. A process that goes
    # on (a test session) signs with that key, and the processes it starts later read it (review27).
    own_process = False

    def run_from_argv(self, argv):
        self.own_process = True
        return super().run_from_argv(argv)

    def handle(self, *args, folder, **options):
        try:
            result = restore(folder, key_made=settings.SECRET_KEY_MADE if self.own_process else ())
        except BackupError as exc:
            raise CommandError(str(exc)) from None
        call_command("migrate", "--noinput", verbosity=0)
        storage_mark_renew()  # a new installation: its own storage token (apps/core/storage_marks.py)
        self.stdout.write(json.dumps(result))
