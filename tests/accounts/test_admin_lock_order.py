"""The admin's membership writes take the team managers' locks as every removal does, first and by
id (``services.team_managers_lock``), so two admins at the same moment wait for one another instead
of deadlocking (PostgreSQL: one of them a 500) or both passing a check each read before the other
wrote (a team left with no manager) (review32).

Threads with their own connections, as ``test_last_manager_race`` does."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection
from django.db.models.signals import pre_delete

from apps.accounts.models import Membership
from apps.accounts.services import MANAGING_ROLES, membership_remove
from apps.core.errors import FieldErrors
from tests.conftest import admin_client, make_user

pytestmark = pytest.mark.django_db(transaction=True)


def locking_queries(on_lock):
    """A hook on this thread's connection: ``on_lock(n)`` before its n-th ``SELECT … FOR UPDATE``."""
    seen = []

    def hook(execute, sql, params, many, context):
        if "FOR UPDATE" in sql:
            seen.append(sql)
            on_lock(len(seen))
        return execute(sql, params, many, context)

    return connection.execute_wrapper(hook)


def test_moving_a_manager_while_another_is_removed_is_no_deadlock(alice, teams, superuser):
    """The move locked its own row, then the team's managers; a removal beside it locked the managers
    below that row by id and waited on it: each waited on the other (review32's suspicion). Here the
    move holds its first lock until the removal is waiting on a lock too."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite's IMMEDIATE transactions serialise the two writers: no row locks to deadlock on")
    vision, robotics = teams["vision"], teams["robotics"]
    dave, erin = make_user("dave", vision, "manager"), make_user("erin", vision, "manager")
    moved = Membership.objects.get(user=erin, team=vision)
    first_lock_held, removal_locking = threading.Event(), threading.Event()
    answers, errors = [], []

    def move_hook(n: int) -> None:
        if n == 1:
            return
        if n == 2:  # holding its first lock: the removal starts locking, and waits
            removal_locking.wait(10)
            time.sleep(1.0)

    def move() -> None:
        try:
            client = admin_client(superuser)
            with locking_queries(lambda n: (move_hook(n), n == 1 and first_lock_held.set())):
                response = client.post(
                    f"/admin/accounts/membership/{moved.pk}/change/",
                    {"user": erin.pk, "team": robotics.pk, "role": "manager"},
                )
            answers.append(response.status_code)
        except Exception as exc:  # noqa: BLE001 - a deadlock's 500 lands here
            errors.append(exc)
        finally:
            first_lock_held.set()
            connection.close()

    def remove() -> None:
        try:
            first_lock_held.wait(10)
            with locking_queries(lambda n: removal_locking.set()):
                membership_remove(
                    membership=Membership.objects.select_related("user", "team").get(user=dave, team=vision)
                )
        except Exception as exc:  # noqa: BLE001 - DeadlockDetected lands here
            errors.append(exc)
        finally:
            removal_locking.set()
            connection.close()

    workers = [threading.Thread(target=move), threading.Thread(target=remove)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)

    assert errors == [] and not any(w.is_alive() for w in workers), errors
    assert answers == [302]
    assert set(Membership.objects.filter(team=vision).values_list("user__username", flat=True)) == {"alice"}
    assert Membership.objects.filter(team=robotics, user=erin, role="manager").exists()


def test_deleting_an_account_while_the_team_s_other_manager_is_removed_leaves_one(alice, teams, superuser):
    """The account's delete checked that another manager stayed, then took its membership with it,
    unlocked: the removal of that other manager at the same moment read it still there too, and
    both went (review32). Each write is held at its membership's delete until the other has checked
    too (or 3 s have passed: with the lock the second cannot check before the first commits)."""
    vision = teams["vision"]
    dave = make_user("dave", vision, "manager")
    both_deleting, start = threading.Barrier(2), threading.Barrier(2)
    answers, refused, errors = [], [], []

    def hold(sender, instance, **kwargs):
        try:
            both_deleting.wait(3)
        except threading.BrokenBarrierError:
            pass

    def delete_account() -> None:
        try:
            client = admin_client(superuser)
            start.wait(10)
            response = client.post(f"/admin/auth/user/{alice.pk}/delete/", {"post": "yes"}, follow=True)
            answers.append(" ".join([str(m) for m in response.context["messages"]]) + response.content.decode())
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connection.close()

    def remove() -> None:
        try:
            start.wait(10)
            membership_remove(membership=Membership.objects.select_related("user", "team").get(user=dave, team=vision))
        except FieldErrors as exc:
            refused.append(exc.errors["role"])
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connection.close()

    pre_delete.connect(hold, sender=Membership)
    try:
        workers = [threading.Thread(target=delete_account), threading.Thread(target=remove)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
    finally:
        pre_delete.disconnect(hold, sender=Membership)

    assert errors == [] and not any(w.is_alive() for w in workers), errors
    assert Membership.objects.filter(team=vision, role__in=MANAGING_ROLES).count() == 1, (answers, refused)
    # Exactly one of the two was refused, and said so (a message; or, where the account's delete came
    # second on SQLite, its confirmation's "Cannot delete" list: there the check is in its transaction).
    account_kept = type(alice).objects.filter(pk=alice.pk).exists()
    assert account_kept != bool(refused), refused
    assert not account_kept or "alice is the last manager of vision" in answers[0]
