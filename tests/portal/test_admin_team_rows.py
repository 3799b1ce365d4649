"""The team page's member rows (review32): a row given another user replaces that member
(review31), but a user who is still on a row of the page after the save is no removal: two rows'
users swapped, or a row given the user of a row deleted in the same save. Both members were
removed (their queued jobs cancelled), "changed successfully", or a 500 where they were managers."""

from __future__ import annotations

import pytest
from django.db.models.signals import post_save

from apps.accounts.models import Membership, Team
from tests.conftest import admin_client
from tests.security.test_admin_audit import form_data

pytestmark = pytest.mark.django_db


def rows(data: dict) -> dict[str, int]:
    """Form index of each member row by its membership's user id."""
    by_id = {str(m.pk): m.user_id for m in Membership.objects.all()}
    return {
        str(by_id[data[f"memberships-{i}-id"]]): i
        for i in range(int(data["memberships-TOTAL_FORMS"]))
        if data.get(f"memberships-{i}-id") in by_id
    }


def members(team) -> list[tuple[str, str]]:
    return sorted(Membership.objects.filter(team=team).values_list("user__username", "role"))


def test_swapping_two_rows_users_swaps_their_roles_and_removes_nobody(superuser, alice, bob, carol, teams):
    """alice (manager) and bob (member) swapped between their rows: bob manager, alice member. Both
    were removed as "replaced" (each row's old member), the team left to carol; with no other
    manager the last removal was refused mid-save, a 500."""
    from apps.accounts.services import membership_set

    membership_set(user=carol, team=teams["vision"], role="manager")
    client = admin_client(superuser)
    url = f"/admin/accounts/team/{teams['vision'].pk}/change/"
    data = form_data(client, url)
    at = rows(data)
    data[f"memberships-{at[str(alice.pk)]}-user"] = str(bob.pk)
    data[f"memberships-{at[str(bob.pk)]}-user"] = str(alice.pk)
    response = client.post(url, data)
    assert response.status_code == 302
    assert members(teams["vision"]) == [("alice", "member"), ("bob", "manager"), ("carol", "manager")]


def test_swapping_the_only_manager_s_row_with_a_member_s_is_not_a_500(superuser, alice, bob, teams):
    client = admin_client(superuser)
    url = f"/admin/accounts/team/{teams['vision'].pk}/change/"
    data = form_data(client, url)
    at = rows(data)
    data[f"memberships-{at[str(alice.pk)]}-user"] = str(bob.pk)
    data[f"memberships-{at[str(bob.pk)]}-user"] = str(alice.pk)
    response = client.post(url, data)
    assert response.status_code == 302
    assert members(teams["vision"]) == [("alice", "member"), ("bob", "manager")]


def test_a_row_given_the_user_of_a_row_deleted_in_the_same_save_keeps_that_user(superuser, alice, bob, carol, teams):
    """alice's row given bob, bob's own row deleted: bob takes alice's row (manager), alice goes.
    bob was promoted on his row, then removed with it: nobody left of the two."""
    from apps.accounts.services import membership_set

    membership_set(user=carol, team=teams["vision"], role="manager")
    client = admin_client(superuser)
    url = f"/admin/accounts/team/{teams['vision'].pk}/change/"
    data = form_data(client, url)
    at = rows(data)
    data[f"memberships-{at[str(alice.pk)]}-user"] = str(bob.pk)
    data[f"memberships-{at[str(bob.pk)]}-DELETE"] = "on"
    response = client.post(url, data)
    assert response.status_code == 302
    assert members(teams["vision"]) == [("bob", "manager"), ("carol", "manager")]


def test_a_replaced_member_removed_meanwhile_is_not_a_500(superuser, alice, bob, carol, teams):
    """bob's row given carol, and bob removed by another admin between the form's checks and the
    save (stood in for by a write at the team row's save, which comes before the rows'): the
    re-read of bob's row raised DoesNotExist, a 500. carol is added; bob is gone already."""
    from apps.accounts.services import membership_remove

    client = admin_client(superuser)
    url = f"/admin/accounts/team/{teams['vision'].pk}/change/"
    data = form_data(client, url)
    data[f"memberships-{rows(data)[str(bob.pk)]}-user"] = str(carol.pk)

    def another_admin_removes_bob(sender, instance, **kwargs):
        if (gone := Membership.objects.filter(team=instance, user=bob).first()) is not None:
            membership_remove(membership=gone)

    post_save.connect(another_admin_removes_bob, sender=Team)
    try:
        response = client.post(url, data)
    finally:
        post_save.disconnect(another_admin_removes_bob, sender=Team)
    assert response.status_code == 302
    assert members(teams["vision"]) == [("alice", "manager"), ("carol", "member")]
