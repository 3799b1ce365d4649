"""manage.py demo_setup: teams, users, a generated demo dataset. Safe to run again: what exists stays."""

from __future__ import annotations

import os

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from apps.accounts.models import Membership
from apps.accounts.services import membership_set, team_ensure, user_ensure
from apps.core.storage import StorageUnavailable
from apps.datasets.demo import generate_demo_dataset
from apps.datasets.services import ArchiveRejected, dataset_register

DEMO_USERS = (  # username, superuser, (team, role) or None
    ("admin", True, None),
    ("alice", False, ("vision", Membership.Role.MANAGER)),
    ("bob", False, ("vision", Membership.Role.MEMBER)),
    ("carol", False, ("robotics", Membership.Role.MEMBER)),
)


class Command(BaseCommand):
    help = ("Create the demo teams (vision, robotics), users (alice, bob, carol, admin) and dataset. "
            "Users that exist are left as they are.")

    def handle(self, *args, **options):
        password = os.environ.get("DEMO_PASSWORD") or "yolo-demo"
        teams = {"vision": team_ensure(slug="vision", name="Vision"),
                 "robotics": team_ensure(slug="robotics", name="Robotics")}
        User = get_user_model()
        created = []
        for username, superuser, membership in DEMO_USERS:
            # `make run` runs this on every start: a user that exists keeps the password, roles and
            # teams given since (it reset them to the public demo password and roles each restart).
            if User.objects.filter(username=username).exists():
                continue
            user = user_ensure(username=username, password=password, superuser=superuser)
            created.append(username)
            if membership is not None:
                team, role = membership
                membership_set(user=user, team=teams[team], role=role)
                if role == Membership.Role.MANAGER:  # managers use Django admin for their teams
                    User.objects.filter(pk=user.pk).update(is_staff=True)

        data_yaml = generate_demo_dataset(settings.DATASETS_DIR / "_shared" / "demo")
        refused = {}
        try:
            for slug, team in teams.items():
                try:
                    dataset_register(team=team, name="demo", yaml_path=data_yaml,
                                     description="generated shapes (rectangle, circle, triangle)")
                except ArchiveRejected as exc:  # the team's own 'demo' is another kind: it stays, and so does `make run`
                    refused[slug] = exc.summary
        except StorageUnavailable as exc:  # a line, not a traceback (multi-node trial M3)
            raise CommandError(f"the demo dataset was not registered: {exc}; run demo_setup again once "
                               "the store answers (the users above are made)") from exc
        self.stdout.write(self.style.SUCCESS("demo data ready"))
        self.stdout.write("  users: admin (superuser), alice (vision manager), bob (vision), carol (robotics)")
        if created:
            self.stdout.write(f"  password of {', '.join(created)}: {password}" + (
                "" if os.environ.get("DEMO_PASSWORD") else "  (set DEMO_PASSWORD to choose another)"))
        if len(created) < len(DEMO_USERS):
            kept = [u for u, *_ in DEMO_USERS if u not in created]
            self.stdout.write(f"  {', '.join(kept)}: already there, password and teams left as they are")
        registered = [slug for slug in teams if slug not in refused]
        if registered:
            self.stdout.write(f"  dataset 'demo' registered for {' and '.join(registered)}: {data_yaml}")
        for slug, why in refused.items():
            self.stdout.write(self.style.WARNING(f"  dataset 'demo' not registered for {slug}: {why}"))
