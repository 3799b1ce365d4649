"""manage.py team: teams and their members from the command line (admin keeps working as before).

    manage.py team create team-a --manager alice --member bob [--name "Team A"]
    manage.py team add-member team-a carol [--manager]
    manage.py team remove-member team-a carol
    manage.py team list

Users that do not exist yet are created without a usable password (set one with
``manage.py changepassword NAME``, or let them sign in through SSO later) — unless the name
is close to an existing user's (``alcie`` beside ``alice``: a typo would make a stray account,
a staff one for ``--manager``): then it is refused, naming the close ones, unless ``--create``. Role changes and
removals go through the same services as admin, so they are in the audit log (actor:
"operator (manage.py team …)"), with the queued jobs a removal cancels.
"""

from __future__ import annotations

import difflib
import re

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from apps.accounts.models import Membership, Team
from apps.accounts.services import (
    membership_remove,
    membership_set,
    operator_named,
    storage_limit_bytes,
    storage_used_bytes,
    team_ensure,
)
from apps.core.errors import FieldErrors

SLUG = re.compile(r"^[a-z0-9][a-z0-9-]{0,49}$")


class Command(BaseCommand):
    help = "Create teams, add or remove members, list teams."

    def add_arguments(self, parser):
        verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
        create = verbs.add_parser("create", help="create a team (or add people to an existing one)")
        create.add_argument("slug", help="lowercase letters, digits and '-', e.g. team-a")
        create.add_argument("--name", help="display name (default: from the slug)")
        create.add_argument("--manager", action="append", default=[], metavar="USER",
                            help="a manager of the team (repeatable; a team needs one)")
        create.add_argument("--member", action="append", default=[], metavar="USER",
                            help="a member of the team (repeatable)")
        create.add_argument("--create", action="store_true",
                            help="create a user even when the name is close to an existing one")
        add = verbs.add_parser("add-member", help="add a user to a team (or change their role)")
        add.add_argument("slug")
        add.add_argument("username")
        add.add_argument("--manager", action="store_true", help="as a manager (default: member)")
        add.add_argument("--create", action="store_true",
                         help="create the user even when the name is close to an existing one")
        remove = verbs.add_parser("remove-member", help="take a user out of a team")
        remove.add_argument("slug")
        remove.add_argument("username")
        verbs.add_parser("list", help="teams, their members and storage use")

    def handle(self, *args, verb: str, **options):
        return getattr(self, verb.replace("-", "_"))(**options)

    # --- verbs ---------------------------------------------------------------------------------

    def create(self, *, slug: str, name: str | None, manager: list[str], member: list[str], create: bool, **_):
        if not SLUG.match(slug):
            raise CommandError(f"team {slug!r}: use lowercase letters, digits and '-' (at most 50), e.g. team-a")
        overlap = set(manager) & set(member)
        if overlap:
            raise CommandError(f"{', '.join(sorted(overlap))}: give each person once, as --manager or --member")
        with transaction.atomic():
            existed = Team.objects.filter(slug=slug).exists()
            team = team_ensure(slug=slug, name=name or slug.replace("-", " ").title())
            for username in manager:
                self.join(team, username, Membership.Role.MANAGER, create)
            for username in member:
                self.join(team, username, Membership.Role.MEMBER, create)
            # A team no one manages is run by superusers alone (optrial24, F13): refused, all of it undone.
            if not team.memberships.filter(role=Membership.Role.MANAGER).exists():
                raise CommandError(f"team {slug} {'has' if existed else 'would have'} no manager: give one with "
                                   f"--manager USER (who manages its people, quotas and jobs; without one only "
                                   f"a superuser can)")
        self.stdout.write(self.style.SUCCESS(f"team {slug} {'already existed' if existed else 'created'}"))

    def add_member(self, *, slug: str, username: str, manager: bool, create: bool, **_):
        team = self.team(slug)
        self.join(team, username, Membership.Role.MANAGER if manager else Membership.Role.MEMBER, create)

    def remove_member(self, *, slug: str, username: str, **_):
        team = self.team(slug)
        membership = Membership.objects.filter(team=team, user__username=username).first()
        if membership is None:
            raise CommandError(f"{username} is not a member of {slug}")
        try:
            done = membership_remove(membership=membership, by=operator_named("team remove-member"))
        except FieldErrors as exc:
            raise CommandError(f"{username} not removed: {exc.errors['role']}") from None
        self.stdout.write(f"{username} removed from {slug}")
        for said in done:
            self.stdout.write(said)

    def list(self, **_):
        teams = Team.objects.prefetch_related("memberships__user").order_by("slug")
        if not teams:
            self.stdout.write("no teams yet: manage.py team create SLUG --manager USER")
            return
        for team in teams:
            people = sorted(team.memberships.all(), key=lambda m: (m.role != Membership.Role.MANAGER,
                                                                     m.user.username))
            # A deactivated account stays a member (its jobs and history), but is nobody's to count on.
            members = ", ".join(f"{m.user.username} ({m.role}{'' if m.user.is_active else ', inactive'})"
                                for m in people) or "no members"
            used, limit = storage_used_bytes(team), storage_limit_bytes(team)
            self.stdout.write(f"{team.slug:<20} {team.name:<24} {members}  [storage {used / 1024**3:.2f}"
                              f"/{limit / 1024**3:.0f} GiB]")

    # --- helpers -------------------------------------------------------------------------------

    def team(self, slug: str) -> Team:
        team = Team.objects.filter(slug=slug).first()
        if team is None:
            known = ", ".join(Team.objects.values_list("slug", flat=True)) or "none yet"
            raise CommandError(f"no team {slug!r} (teams: {known})")
        return team

    def join(self, team: Team, username: str, role: str, create: bool = False) -> None:
        User = get_user_model()
        user = User.objects.filter(username=username).first()
        if user is None:
            known = {name.lower(): name for name in User.objects.values_list("username", flat=True)}
            close = [known[c] for c in difflib.get_close_matches(username.lower(), list(known), n=3, cutoff=0.75)]
            if close and not create:
                raise CommandError(f"no user {username!r}; did you mean {' or '.join(close)}? (--create makes a new "
                                   f"user {username!r})")
            user = User(username=username)
            user.set_unusable_password()
            try:
                user.full_clean(exclude=["password"])
            except ValidationError as exc:
                raise CommandError(f"user {username!r}: {' '.join(exc.message_dict.get('username', exc.messages))}") \
                    from None
            user.save()
            self.stdout.write(f"created user {username} (no password yet: manage.py changepassword {username})")
        try:
            membership_set(user=user, team=team, role=role, by=operator_named("team"))
        except FieldErrors as exc:
            raise CommandError(f"{username}'s role in {team.slug} is unchanged: {exc.errors['role']}") from None
        if role == Membership.Role.MANAGER and not user.is_staff:
            # Managers run their team from Django admin (scoped to their teams).
            User.objects.filter(pk=user.pk).update(is_staff=True)
        self.stdout.write(f"{username} is {role} of {team.slug}")
