"""manage.py team: teams and members from the command line, through the audited services."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from apps.accounts.models import AuditEntry, Membership, Team

pytestmark = pytest.mark.django_db


def team(*args) -> str:
    out = io.StringIO()
    call_command("team", *args, stdout=out)
    return out.getvalue()


def test_create_makes_the_team_its_manager_and_members_creating_missing_users():
    out = team("create", "team-a", "--manager", "alice", "--member", "bob", "--member", "carol")
    assert "team team-a created" in out and "created user bob" in out
    created = Team.objects.get(slug="team-a")
    roles = dict(Membership.objects.filter(team=created).values_list("user__username", "role"))
    assert roles == {"alice": "manager", "bob": "member", "carol": "member"}
    alice = get_user_model().objects.get(username="alice")
    assert alice.is_staff and not alice.has_usable_password()
    assert AuditEntry.objects.filter(action="role.change", team=created).count() == 3


def test_add_member_changes_a_role_and_remove_member_takes_someone_out():
    team("create", "team-a", "--manager", "alice")
    team("add-member", "team-a", "bob")
    team("add-member", "team-a", "bob", "--manager")
    assert Membership.objects.get(user__username="bob").role == "manager"
    team("remove-member", "team-a", "bob")
    assert not Membership.objects.filter(user__username="bob").exists()
    assert AuditEntry.objects.filter(action="membership.remove").exists()


def test_list_shows_members_and_storage():
    team("create", "team-a", "--manager", "alice", "--member", "bob")
    out = team("list")
    assert "team-a" in out and "alice (manager)" in out and "bob (member)" in out and "GiB" in out


@pytest.mark.parametrize(("args", "words"), [
    (("create", "Team A"), "lowercase letters"),
    (("create", "t", "--manager", "x", "--member", "x"), "give each person once"),
    (("add-member", "nope", "bob"), "no team 'nope'"),
    (("remove-member", "nope", "bob"), "no team 'nope'"),
    (("create", "t", "--member", "bad name!"), "user 'bad name!'"),
])
def test_mistakes_are_named(args, words):
    with pytest.raises(CommandError, match=words):
        team(*args)


def test_a_team_no_one_would_manage_is_refused_and_nothing_is_made():
    """``team create x`` made a team only superusers could manage (optrial24, F13)."""
    with pytest.raises(CommandError, match=r"team team-a would have no manager: give one with --manager USER"):
        team("create", "team-a", "--member", "bob")
    assert not Team.objects.filter(slug="team-a").exists()
    assert not get_user_model().objects.filter(username="bob").exists()


def test_creating_an_existing_team_adds_people_to_it():
    team("create", "team-a", "--manager", "alice")
    assert "already existed" in team("create", "team-a", "--member", "bob")
    assert Membership.objects.filter(team__slug="team-a").count() == 2


def test_a_name_close_to_an_existing_user_is_refused_unless_created_on_purpose():
    """A typo made a stray account (a staff one for --manager): manager trial."""
    team("create", "team-a", "--manager", "alice")
    with pytest.raises(CommandError, match=r"no user 'alcie'; did you mean alice\? \(--create makes a new user"):
        team("add-member", "team-a", "alcie", "--manager")
    with pytest.raises(CommandError, match="did you mean alice"):
        team("create", "team-b", "--manager", "Alice")
    assert not get_user_model().objects.filter(username__in=["alcie", "Alice"]).exists()
    assert "created user alcie" in team("add-member", "team-a", "alcie", "--create")
    assert "created user zoe" in team("add-member", "team-a", "zoe")  # not close to anyone: made as before


def test_list_marks_deactivated_members():
    """A deactivated account was listed as a plain member (manager trial 15, F6)."""
    team("create", "team-a", "--manager", "alice", "--member", "carol")
    get_user_model().objects.filter(username="carol").update(is_active=False)
    out = team("list")
    assert "alice (manager)" in out and "carol (member, inactive)" in out
