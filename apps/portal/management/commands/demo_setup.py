"""manage.py demo_setup: teams, users, a generated demo dataset. Safe to run twice."""

from __future__ import annotations

import os

from django.conf import settings
from django.core.management.base import BaseCommand

from apps.accounts.models import Membership
from apps.accounts.services import membership_set, team_ensure, user_ensure
from apps.datasets.demo import generate_demo_dataset
from apps.datasets.services import dataset_register


class Command(BaseCommand):
    help = "Create demo teams (vision, robotics), users (alice, bob, carol, admin) and the demo dataset."

    def handle(self, *args, **options):
        password = os.environ.get("DEMO_PASSWORD") or "yolo-demo"
        vision = team_ensure(slug="vision", name="Vision")
        robotics = team_ensure(slug="robotics", name="Robotics")
        user_ensure(username="admin", password=password, superuser=True)
        alice = user_ensure(username="alice", password=password)
        bob = user_ensure(username="bob", password=password)
        carol = user_ensure(username="carol", password=password)
        membership_set(user=alice, team=vision, role=Membership.Role.MANAGER)
        membership_set(user=bob, team=vision, role=Membership.Role.MEMBER)
        membership_set(user=carol, team=robotics, role=Membership.Role.MEMBER)
        # Managers use Django admin for their teams.
        type(alice).objects.filter(pk=alice.pk).update(is_staff=True)

        data_yaml = generate_demo_dataset(settings.DATASETS_DIR / "_shared" / "demo")
        for team in (vision, robotics):
            dataset_register(team=team, name="demo", yaml_path=data_yaml,
                             description="generated shapes (rectangle, circle, triangle)")
        self.stdout.write(self.style.SUCCESS("demo data ready"))
        self.stdout.write("  users: admin (superuser), alice (vision manager), bob (vision), carol (robotics)")
        self.stdout.write(f"  password for all: {password}" + ("" if os.environ.get("DEMO_PASSWORD") else
                                                               "  (set DEMO_PASSWORD to choose another)"))
        self.stdout.write(f"  dataset 'demo' registered for vision and robotics: {data_yaml}")
