from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from apps.accounts.services import token_create


class Command(BaseCommand):
    help = "Create an API token for a user and print it (shown once; only its hash is stored)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="cli")
        parser.add_argument("--days", type=int, default=None, help="expire after this many days")

    def handle(self, *args, username: str, name: str, days: int | None, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no user named {username!r}")
        _, key = token_create(user=user, name=name, ttl_days=days)
        self.stdout.write(key)
