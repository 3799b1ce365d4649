from __future__ import annotations

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from apps.accounts.services import TOKEN_MAX_DAYS, operator_named, token_create


class Command(BaseCommand):
    help = "Create an API token for a user and print it (shown once; only its hash is stored)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="cli")
        expiry = parser.add_mutually_exclusive_group()
        expiry.add_argument("--days", type=int, default=None,
                            help=f"expire after this many days (default API_TOKEN_DEFAULT_DAYS, now "
                                 f"{settings.API_TOKEN_DEFAULT_DAYS})")
        expiry.add_argument("--no-expiry", action="store_true",
                            help="a token that never expires, for automation (revoke it when it is done with)")

    def handle(self, *args, username: str, name: str, days: int | None, no_expiry: bool = False, **options):
        try:
            user = get_user_model().objects.filter(username=username).first()
        except DatabaseError as exc:  # e.g. `make run` used another DATA_DIR: "no such table: auth_user"
            raise CommandError(f"cannot read the users from the database ({exc}); DATA_DIR is {settings.DATA_DIR}: "
                               "set DATA_DIR as `make run` had it, or run `make run` first") from exc
        if user is None:
            raise CommandError(f"no user named {username!r}")
        if not user.is_active:  # its token would be refused at once (401): say so here
            raise CommandError(f"{username} is deactivated: reactivate the account (admin, Users) first")
        if days is not None and not 1 <= days <= TOKEN_MAX_DAYS:
            # 0 made a token that never expires, -3 one expired on arrival (manager trial)
            raise CommandError(f"--days {days}: give 1 to {TOKEN_MAX_DAYS} days, or --no-expiry for a token "
                               "that never expires")
        if days is None and not no_expiry:
            # The expiry of every new token, as the README says (it made a non-expiring one; manager trial 15, F26).
            days = settings.API_TOKEN_DEFAULT_DAYS
        _, key = token_create(user=user, name=name, ttl_days=days, by=operator_named("issue_token"))
        self.stdout.write(key)
