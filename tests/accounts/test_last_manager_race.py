"""Two admins removing a team's last two managers at the same moment: each removal alone passed
``last_manager_error`` (the other was still there) and both went, a team nobody manages (review31).
The removal now locks the team's managing memberships in its transaction and checks under the
lock (``services.team_managers_lock``): the second waits for the first, reads it gone, is refused.

Threads with their own connections (PostgreSQL rows locks; SQLite's IMMEDIATE transactions).
A ``pre_delete`` (a removal) or ``pre_save`` (a demotion) holds each write until the other has
checked too (or 3 s have passed: with the lock the second cannot check before the first commits)."""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from django.db.models.signals import pre_delete, pre_save

from apps.accounts.models import Membership
from apps.accounts.services import MANAGING_ROLES, membership_remove, membership_set
from apps.core.errors import FieldErrors
from tests.conftest import make_user

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("second", ["remove", "demote"])
def test_removing_a_team_s_last_two_managers_at_once_leaves_one(alice, teams, second):
    vision = teams["vision"]
    dave = make_user("dave", vision, "manager")
    both_deleting = threading.Barrier(2)
    start = threading.Barrier(2)
    done, refused, errors = [], [], []

    def hold(sender, instance, **kwargs):
        try:
            both_deleting.wait(3)
        except threading.BrokenBarrierError:
            pass

    def remove(user) -> None:
        try:
            start.wait(10)
            if second == "demote" and user.username == "dave":
                membership_set(user=user, team=vision, role="member")  # held at its row's save (pre_save)
            else:
                membership_remove(
                    membership=Membership.objects.select_related("user", "team").get(user=user, team=vision)
                )
            done.append(user.username)
        except FieldErrors as exc:
            refused.append(exc.errors["role"])
        except Exception as exc:  # noqa: BLE001 - reported to the test (a deadlock would land here)
            errors.append(exc)
        finally:
            connection.close()

    pre_delete.connect(hold, sender=Membership)
    pre_save.connect(hold, sender=Membership)
    try:
        workers = [threading.Thread(target=remove, args=(user,)) for user in (alice, dave)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
    finally:
        pre_delete.disconnect(hold, sender=Membership)
        pre_save.disconnect(hold, sender=Membership)
    assert errors == [] and not any(w.is_alive() for w in workers)
    assert len(done) == 1 and len(refused) == 1, (done, refused)
    assert "is the last manager of vision" in refused[0]
    assert Membership.objects.filter(team=vision, role__in=MANAGING_ROLES).count() == 1
