"""A team keeps a manager: its last one is neither demoted nor removed, in admin or by
manage.py team, and the refusal says whom to make manager first (trial 14, F13/F35)."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from apps.accounts.models import Membership
from tests.conftest import admin_client, make_user
from tests.security.test_admin_audit import form_data

pytestmark = pytest.mark.django_db


def role_of(user, team) -> str:
    return Membership.objects.get(user=user, team=team).role


def test_the_last_manager_cannot_make_themselves_a_member_in_admin(manager, bob, teams):
    own = Membership.objects.get(user=manager, team=teams["vision"])
    url = f"/admin/accounts/membership/{own.pk}/change/"
    client = admin_client(manager)
    response = client.post(url, form_data(client, url) | {"role": "member"})
    assert response.status_code == 200
    assert response.context["adminform"].form.errors["role"] == [
        "alice is the last manager of vision; make bob its manager first"]
    assert role_of(manager, teams["vision"]) == "manager"


def test_the_last_manager_cannot_be_removed_in_admin_on_either_page(manager, bob, teams):
    own = Membership.objects.get(user=manager, team=teams["vision"])
    client = admin_client(manager)
    refused = client.post(f"/admin/accounts/membership/{own.pk}/delete/", {"post": "yes"}, follow=True)
    assert "Not removed: alice is the last manager of vision; make bob its manager first" in refused.content.decode()
    bulk = client.post("/admin/accounts/membership/", {"action": "delete_selected", "_selected_action": [own.pk],
                                                       "post": "yes"}).content.decode()
    assert "Cannot delete membership" in bulk and "make bob its manager first" in bulk
    assert role_of(manager, teams["vision"]) == "manager"


def test_on_the_team_page_a_manager_may_hand_over_but_not_leave_the_team_without_one(superuser, alice, bob, teams):
    url = f"/admin/accounts/team/{teams['vision'].pk}/change/"
    client = admin_client(superuser)
    data = form_data(client, url)
    rows = {data[f"memberships-{i}-id"]: i for i in range(int(data["memberships-TOTAL_FORMS"]))}
    alice_row = rows[str(Membership.objects.get(user=alice).pk)]
    bob_row = rows[str(Membership.objects.get(user=bob).pk)]

    refused = client.post(url, data | {f"memberships-{alice_row}-role": "member"})
    assert refused.status_code == 200
    assert "alice is the last manager of vision; make bob its manager first" in refused.content.decode()
    assert role_of(alice, teams["vision"]) == "manager"

    handed_over = client.post(url, data | {f"memberships-{alice_row}-role": "member",
                                           f"memberships-{bob_row}-role": "manager"})
    assert handed_over.status_code == 302
    assert (role_of(alice, teams["vision"]), role_of(bob, teams["vision"])) == ("member", "manager")


def test_a_manager_who_steps_down_lands_on_the_portal_with_a_message_not_a_403(manager, bob, teams):
    Membership.objects.filter(user=bob).update(role="manager")
    own = Membership.objects.get(user=manager, team=teams["vision"])
    url = f"/admin/accounts/membership/{own.pk}/change/"
    client = admin_client(manager)
    response = client.post(url, form_data(client, url) | {"role": "member"}, follow=True)
    assert response.status_code == 200 and response.redirect_chain[-1][0] == "/"
    assert "you are no longer a manager of vision" in response.content.decode()
    assert role_of(manager, teams["vision"]) == "member"


def test_a_manager_who_hands_the_team_over_on_its_page_lands_on_the_admin_index_not_a_403(manager, bob, teams):
    """One save made bob manager and alice member; her browser followed Django's redirect to the
    Teams list she may no longer open, a bare 403 (manager trial 15, F25)."""
    url = f"/admin/accounts/team/{teams['vision'].pk}/change/"
    client = admin_client(manager)
    data = form_data(client, url)
    rows = {data[f"memberships-{i}-id"]: i for i in range(int(data["memberships-TOTAL_FORMS"]))}
    response = client.post(url, data | {f"memberships-{rows[str(Membership.objects.get(user=manager).pk)]}-role": "member",
                                        f"memberships-{rows[str(Membership.objects.get(user=bob).pk)]}-role": "manager"},
                           follow=True)
    assert (role_of(manager, teams["vision"]), role_of(bob, teams["vision"])) == ("member", "manager")
    assert response.status_code == 200 and response.redirect_chain[-1][0] == "/admin/"
    assert [str(m) for m in response.context["messages"]] == ["saved; you no longer manage vision"]


def test_manage_py_team_refuses_to_remove_or_demote_the_last_manager(alice, bob, teams):
    make_user("dave", teams["robotics"], "manager")
    with pytest.raises(CommandError, match="dave not removed: dave is the last manager of robotics; "
                                           "add another manager first"):
        call_command("team", "remove-member", "robotics", "dave", stdout=io.StringIO())
    with pytest.raises(CommandError, match="alice's role in vision is unchanged: alice is the last manager of "
                                           "vision; make bob its manager first"):
        call_command("team", "add-member", "vision", "alice", stdout=io.StringIO())
    assert role_of(alice, teams["vision"]) == "manager"
    assert Membership.objects.filter(user__username="dave", team=teams["robotics"]).exists()


def test_someone_made_manager_in_admin_can_sign_in_to_admin(superuser, bob, teams):
    """Operator trial 20, F8: made a team's manager on its admin page, bob could not sign in to
    the admin that managers run their team from ("enter the correct username and password for a
    staff account"); only `manage.py team` and demo_setup made managers staff."""
    from django.test import Client

    membership = Membership.objects.get(user=bob, team=teams["vision"])
    admin_client(superuser).post(f"/admin/accounts/membership/{membership.pk}/change/",
                                 {"user": bob.pk, "team": teams["vision"].pk, "role": "manager"})
    assert Membership.objects.get(pk=membership.pk).role == "manager"
    client = Client()
    client.post("/admin/login/", {"username": "bob", "password": "pw-bob", "next": "/admin/"})
    assert client.get("/admin/jobs/job/").status_code == 200
