"""A member taken out of a team while their jobs wait there (trial 14, F40): the removal says how
many, cancels their queued jobs in that team naming who removed them, and leaves running ones."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from apps.accounts.models import AuditEntry, Membership
from apps.jobs.models import Job, JobState
from tests.conftest import admin_client, make_user
from tests.jobs.factories import make_job

pytestmark = pytest.mark.django_db


@pytest.fixture
def bobs_jobs(bob, teams):
    make_user("bob", teams["robotics"])  # bob is in robotics too: his job there stays
    return {
        "queued": make_job(team=teams["vision"], user=bob, task_name="bob-orphan"),
        "running": make_job(team=teams["vision"], user=bob, task_name="bob-long", state=JobState.RUNNING),
        "finished": make_job(team=teams["vision"], user=bob, task_name="bob-done", state=JobState.SUCCEEDED),
        "elsewhere": make_job(team=teams["robotics"], user=bob, task_name="bob-robotics"),
    }


def states(jobs: dict) -> dict:
    return {name: Job.objects.get(pk=job.pk).state for name, job in jobs.items()}


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def test_the_delete_confirmation_says_how_many_active_jobs_the_member_has(manager, bob, teams, bobs_jobs):
    membership = Membership.objects.get(user=bob, team=teams["vision"])
    response = admin_client(manager).get(f"/admin/accounts/membership/{membership.pk}/delete/")
    said = " ".join(messages_of(response))
    assert "Active jobs of bob in vision: 1 queued job will be cancelled" in said
    assert "1 running job (bob-long) will be left to finish" in said
    assert states(bobs_jobs)["queued"] == JobState.QUEUED  # asking changes nothing


def test_the_bulk_delete_confirmation_says_it_too(manager, bob, teams, bobs_jobs):
    membership = Membership.objects.get(user=bob, team=teams["vision"])
    response = admin_client(manager).post("/admin/accounts/membership/", {
        "action": "delete_selected", "_selected_action": [str(membership.pk)]})
    assert any("1 queued job will be cancelled" in m for m in messages_of(response))
    assert Membership.objects.filter(pk=membership.pk).exists()


def test_removing_a_member_cancels_their_queued_jobs_in_that_team_only(manager, bob, teams, bobs_jobs):
    membership = Membership.objects.get(user=bob, team=teams["vision"])
    response = admin_client(manager).post(f"/admin/accounts/membership/{membership.pk}/delete/", {"post": "yes"},
                                          follow=True)
    assert states(bobs_jobs) == {"queued": JobState.CANCELLED, "running": JobState.RUNNING,
                                 "finished": JobState.SUCCEEDED, "elsewhere": JobState.QUEUED}
    assert any("Jobs of bob in vision: 1 queued job cancelled (bob-orphan); 1 running job left to finish (bob-long)"
               in m for m in messages_of(response))
    event = bobs_jobs["queued"].events.get(kind="cancelled")
    assert event.message == "cancelled by alice while queued: its owner bob was removed from vision"


def shown_messages(response) -> list[str]:
    """The messages as the admin page renders them (it capitalises each one's first letter)."""
    import re
    from html import unescape

    return [unescape(m) for m in re.findall(r'<li class="[a-z]+">(.*?)</li>', response.content.decode())]


def test_the_delete_says_what_it_did_not_what_it_will_do_and_keeps_the_username_as_it_is(
        manager, bob, teams, bobs_jobs):
    """After the delete the list showed the confirmation's "Bob has active jobs …: 1 queued job will
    be cancelled." beside what was done, and capitalised the case-sensitive username (manager trial 15, F3).
    Django's delete page deletes on any POST (a script's, with its CSRF token only, too)."""
    membership = Membership.objects.get(user=bob, team=teams["vision"])
    client = admin_client(manager)
    asked = shown_messages(client.get(f"/admin/accounts/membership/{membership.pk}/delete/"))
    assert any(m.startswith("Active jobs of bob in vision: 1 queued job will be cancelled") for m in asked), asked
    response = client.post(f"/admin/accounts/membership/{membership.pk}/delete/",
                           {"csrfmiddlewaretoken": "token"}, follow=True)
    shown = shown_messages(response)
    assert states(bobs_jobs)["queued"] == JobState.CANCELLED
    assert not [m for m in shown if "will be" in m], shown
    assert shown[0].startswith("Jobs of bob in vision: 1 queued job cancelled (bob-orphan)"), shown


def test_the_removal_and_each_cancel_are_audited(manager, bob, teams, bobs_jobs):
    membership = Membership.objects.get(user=bob, team=teams["vision"])
    admin_client(manager).post(f"/admin/accounts/membership/{membership.pk}/delete/", {"post": "yes"})
    removal = AuditEntry.objects.get(action="membership.remove")
    assert removal.actor_name == "alice" and "1 queued job cancelled" in removal.message
    assert removal.data["cancelled_jobs"] == [str(bobs_jobs["queued"].pk)]
    assert removal.data["running_jobs"] == [str(bobs_jobs["running"].pk)]
    cancel = AuditEntry.objects.get(action="job.cancel")
    assert cancel.actor_name == "alice" and cancel.target_id == str(bobs_jobs["queued"].pk)


def test_the_team_page_sends_a_member_with_active_jobs_to_the_removal_that_asks_first(manager, bob, teams,
                                                                                      bobs_jobs):
    """Ticking "Delete?" on the team page cancelled a member's queued jobs with no question (manager
    trial 15, F2): such a member is removed on the Memberships page, which says what it cancels first.
    A member without active jobs is still removed here."""
    from tests.security.test_admin_audit import form_data

    erin = make_user("erin", teams["vision"])
    client = admin_client(manager)
    url = f"/admin/accounts/team/{teams['vision'].pk}/change/"

    def tick(user):
        data = form_data(client, url)
        index = next(i for i in range(int(data["memberships-TOTAL_FORMS"])) if data.get(f"memberships-{i}-id")
                     == str(Membership.objects.get(user=user, team=teams["vision"]).pk))
        data[f"memberships-{index}-DELETE"] = "on"
        return client.post(url, data, follow=True)

    html = tick(bob).content.decode()
    assert "Active jobs of bob in vision: 1 queued job will be cancelled" in html
    assert "Remove bob from Memberships, which asks first" in html
    assert Membership.objects.filter(user=bob, team=teams["vision"]).exists()
    assert states(bobs_jobs)["queued"] == JobState.QUEUED
    tick(erin)
    assert not Membership.objects.filter(user=erin, team=teams["vision"]).exists()


def test_the_team_command_says_what_it_cancelled_and_who_did_it(bob, alice, teams, bobs_jobs):
    erin = make_user("erin", teams["vision"])
    make_job(team=teams["vision"], user=erin, state=JobState.SUCCEEDED)  # nothing active: nothing more said
    out = StringIO()
    call_command("team", "remove-member", "vision", "erin", stdout=out)
    call_command("team", "remove-member", "vision", "bob", stdout=out)
    assert out.getvalue().splitlines() == [
        "erin removed from vision",
        "bob removed from vision",
        "Jobs of bob in vision: 1 queued job cancelled (bob-orphan); 1 running job left to finish (bob-long); "
        "a manager may cancel it from the job page"]
    assert states(bobs_jobs)["queued"] == JobState.CANCELLED
    event = bobs_jobs["queued"].events.get(kind="cancelled")
    assert event.message == ("cancelled by operator (manage.py team remove-member) while queued: "
                             "its owner bob was removed from vision")
    # In the audit log as the operator, like an admin removal's, not as "system" (manager trial 15, F1).
    operator = "operator (manage.py team remove-member)"
    assert [e.actor_name for e in AuditEntry.objects.filter(action="job.cancel")] == [operator]
    assert {e.actor_name for e in AuditEntry.objects.filter(action="membership.remove")} == {operator}


def test_a_removed_members_sweep_stops_queuing_trials_for_the_team(manager, bob, teams):
    sweep = make_job(team=teams["vision"], user=bob, state=JobState.RUNNING, is_sweep=True, gpus=0, task_name="sw")
    trial = make_job(team=teams["vision"], user=bob, task_name="sw-trial-1", parent=sweep)
    membership = Membership.objects.get(user=bob, team=teams["vision"])
    client = admin_client(manager)
    said = " ".join(messages_of(client.get(f"/admin/accounts/membership/{membership.pk}/delete/")))
    assert "Active jobs of bob in vision: 1 sweep will be cancelled." in said
    response = client.post(f"/admin/accounts/membership/{membership.pk}/delete/", {"post": "yes"}, follow=True)
    assert "Jobs of bob in vision: 1 sweep cancelled (sw)" in messages_of(response)
    assert Job.objects.get(pk=sweep.pk).state == JobState.CANCELLED
    assert Job.objects.get(pk=trial.pk).state == JobState.CANCELLED


def test_deactivating_an_account_cancels_its_queued_jobs_and_names_a_team_left_without_a_manager(
        superuser, alice, bob, teams, bobs_jobs):
    """A deactivated account's queued jobs still ran, charged to its teams, and nothing told anyone
    (manager trial, with F40); its last-manager role left the team unmanaged without a word."""
    from tests.security.test_admin_audit import form_data

    client = admin_client(superuser)
    alices_job = make_job(team=teams["vision"], user=alice, task_name="alice-q")
    url = f"/admin/auth/user/{bob.pk}/change/"
    data = form_data(client, url)
    data.pop("is_active")  # the unticked box
    response = client.post(url, data, follow=True)
    said = messages_of(response)
    assert states(bobs_jobs) == {"queued": "cancelled", "running": "running", "finished": "succeeded",
                                 "elsewhere": "cancelled"}
    assert any("Jobs of bob in vision: 1 queued job cancelled (bob-orphan)" in m for m in said), said
    assert any("Jobs of bob in robotics: 1 queued job cancelled (bob-robotics)" in m for m in said), said
    event = Job.objects.get(pk=bobs_jobs["queued"].pk).events.get(kind="cancelled")
    assert "its owner bob was deactivated" in event.message
    assert AuditEntry.objects.filter(action="job.cancel", actor=superuser).count() == 2
    assert not [m for m in said if "no active manager" in m]

    url = f"/admin/auth/user/{alice.pk}/change/"
    data = form_data(client, url)
    data.pop("is_active")
    said = messages_of(client.post(url, data, follow=True))
    assert any("No active manager left in vision (alice was its last)" in m for m in said), said
    assert Job.objects.get(pk=alices_job.pk).state == JobState.CANCELLED
    alice.refresh_from_db()
    assert not alice.is_active, "locking someone out is never refused"
