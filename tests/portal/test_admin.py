"""Admin for managers: a team manager sees and edits only their teams; superusers see all."""

from __future__ import annotations

import re

import pytest
from django.db import connection

from apps.accounts.models import Membership, Team
from apps.cluster.models import Node
from apps.jobs.models import Job, JobState
from tests.conftest import admin_client

from .helpers import submit

pytestmark = pytest.mark.django_db


def test_a_manager_sees_only_the_teams_they_manage(manager, carol, teams):
    html = admin_client(manager).get("/admin/accounts/team/").content.decode()
    assert "vision" in html and "robotics" not in html
    robotics = teams["robotics"]
    assert admin_client(manager).get(f"/admin/accounts/team/{robotics.pk}/change/").status_code in (302, 403, 404)


def test_a_manager_cannot_change_the_fair_share_weight(manager, teams):
    vision = teams["vision"]
    response = admin_client(manager).get(f"/admin/accounts/team/{vision.pk}/change/")
    assert response.status_code == 200
    assert 'name="shares"' not in response.content.decode() and 'name="name"' in response.content.decode()


def test_a_manager_cannot_raise_their_teams_storage_quota(manager, teams):
    vision = teams["vision"]
    client = admin_client(manager)
    html = client.get(f"/admin/accounts/team/{vision.pk}/change/").content.decode()
    assert 'name="storage_quota_gb"' not in html  # shown, not editable (a manager set 100000 GiB)
    client.post(f"/admin/accounts/team/{vision.pk}/change/", {
        "name": "Vision", "storage_quota_gb": "100000", "memberships-TOTAL_FORMS": "0",
        "memberships-INITIAL_FORMS": "0"})
    vision.refresh_from_db()
    assert vision.storage_quota_gb is None


def test_membership_lists_and_filters_are_scoped(manager, bob, carol):
    client = admin_client(manager)
    html = client.get("/admin/accounts/membership/").content.decode()
    assert "bob" in html and "carol" not in html
    assert "robotics" not in html  # not even in the team filter


def test_a_manager_adds_a_member_to_their_team_but_not_to_another(manager, carol, teams):
    client = admin_client(manager)
    form = client.get("/admin/accounts/membership/add/").content.decode()
    team_select = form[form.index('name="team"'):].split("</select>")[0]
    assert ">vision<" in team_select and ">robotics<" not in team_select
    assert 'value="admin"' not in form  # only superusers grant the admin role
    response = client.post("/admin/accounts/membership/add/",
                           {"user": "carol", "team": teams["vision"].pk, "role": "member"})  # by username
    assert response.status_code == 302
    assert Membership.objects.filter(user=carol, team=teams["vision"]).exists()
    response = client.post("/admin/accounts/membership/add/",
                           {"user": manager.username, "team": teams["robotics"].pk, "role": "manager"})
    assert response.status_code == 200  # the form refuses the choice
    assert not Membership.objects.filter(user=manager, team=teams["robotics"]).exists()


def test_a_manager_sees_only_their_teams_jobs(manager, carol, demo_registered):
    submit(manager, task_name="vision-job")
    submit(carol, task_name="robotics-job", team="robotics")
    html = admin_client(manager).get("/admin/jobs/job/").content.decode()
    assert "vision-job" in html and "robotics-job" not in html


def test_a_manager_cancels_their_teams_job_with_the_admin_action(manager, bob, demo_registered):
    job = submit(bob, task_name="to-cancel")
    admin_client(manager).post("/admin/jobs/job/", {"action": "cancel", "_selected_action": [str(job.pk)],
                                                   "apply": "yes", "reason": "wrong dataset"})
    assert Job.objects.get(pk=job.pk).state == "cancelled"


def test_the_admin_cancel_asks_why_and_the_owner_is_told(manager, bob, demo_registered):
    """Operator trial 29: the one-click admin cancel told the owner "was cancelled by alice" and no
    reason, where docs/notifications.md promises who and why (the drain actions ask for theirs)."""
    job = submit(bob, task_name="to-cancel")
    client = admin_client(manager)
    page = client.post("/admin/jobs/job/", {"action": "cancel", "_selected_action": [str(job.pk)]})
    assert page.status_code == 200 and "Reason" in page.content.decode() and "to-cancel" in page.content.decode()
    assert Job.objects.get(pk=job.pk).state == "queued"  # nothing done before the reason is given
    empty = client.post("/admin/jobs/job/", {"action": "cancel", "_selected_action": [str(job.pk)], "apply": "yes",
                                             "reason": ""})
    assert "This field is required" in empty.content.decode() and Job.objects.get(pk=job.pk).state == "queued"
    client.post("/admin/jobs/job/", {"action": "cancel", "_selected_action": [str(job.pk)], "apply": "yes",
                                     "reason": "the GPUs are needed for the demo"})
    job.refresh_from_db()
    assert job.state == "cancelled"
    event = job.events.get(kind="cancelled")
    assert event.message == "cancelled by alice while queued: the GPUs are needed for the demo"
    assert event.data["reason"] == "the GPUs are needed for the demo"


def test_a_member_who_is_not_staff_has_no_admin(bob):
    assert admin_client(bob).get("/admin/").status_code == 302


def test_a_manager_may_look_at_nodes_but_not_drain_them(manager, node):
    client = admin_client(manager)
    html = client.get("/admin/cluster/node/").content.decode()
    assert "node-a" in html and 'value="drain"' not in html
    client.post("/admin/cluster/node/", {"action": "drain", "_selected_action": [str(node.pk)], "apply": "yes", "reason": "maintenance"})
    node.refresh_from_db()
    assert node.state == "active"


def test_a_superuser_sees_everything_and_drains_nodes(superuser, teams, node):
    client = admin_client(superuser)
    html = client.get("/admin/accounts/team/").content.decode()
    assert "vision" in html and "robotics" in html
    client.post("/admin/cluster/node/", {"action": "drain", "_selected_action": [str(node.pk)], "apply": "yes", "reason": "maintenance"})
    node.refresh_from_db()
    assert node.state == "draining"


def test_drain_and_resume_say_what_they_did(superuser, node):
    """Trial 14, F5: both actions were silent."""
    client = admin_client(superuser)
    selected = {"_selected_action": [str(node.pk)]}
    html = client.post("/admin/cluster/node/", {"action": "drain", "apply": "yes", "reason": "maintenance", **selected}, follow=True).content.decode()
    assert "1 node(s) draining: they run what they have and start nothing new (node-a; reason: maintenance)" in html
    html = client.post("/admin/cluster/node/", {"action": "drain", "apply": "yes", "reason": "maintenance", **selected}, follow=True).content.decode()
    assert "Not changed: node-a (already draining: maintenance)" in html
    html = client.post("/admin/cluster/node/", {"action": "resume", **selected}, follow=True).content.decode()
    assert "1 node(s) active again: they accept new jobs (node-a)" in html
    assert Node.objects.get(pk=node.pk).state == "active"


def test_the_rq_dashboard_is_for_superusers_only(manager, superuser):
    """A signed-in manager gets a 403 that says why, not the sign-in page again (trial 14, F9)."""
    from django.test import Client

    for path in ("/admin/rq/", "/admin/django_rq/dashboard/"):
        response = admin_client(manager).get(path)
        assert response.status_code == 403, path
        assert "superusers only: the RQ dashboard shows every team&#x27;s queued work" in response.content.decode()
        assert admin_client(superuser).get(path).status_code == 200, path
        assert Client().get(path).status_code == 302, path  # not signed in: the sign-in page


def test_api_tokens_are_not_shown_to_managers(manager):
    assert admin_client(manager).get("/admin/accounts/apitoken/").status_code == 403


def test_the_admin_index_lists_only_what_a_manager_may_use(manager):
    html = admin_client(manager).get("/admin/").content.decode()
    assert "Teams" in html and "Jobs" in html and "Api tokens" not in html and "Django-RQ" not in html
    assert Team.objects.count() == 2


def test_admin_labels_are_spelled_as_people_write_them(superuser):
    """Trial 14, F3: the index said "Audit entrys" and "Gpus", the job list and quota form "Gpus"/"Max gpus"."""
    client = admin_client(superuser)
    pages = {url: client.get(url).content.decode()
             for url in ("/admin/", "/admin/jobs/job/", "/admin/quotas/teamquota/add/", "/admin/cluster/gpu/")}
    text = "\n".join(pages.values())
    for wrong in ("Audit entrys", "Gpus", "Gpu slot", "Max gpus", "gpu hours"):
        assert wrong not in text, wrong
    assert "Audit entries" in pages["/admin/"] and ">GPUs<" in pages["/admin/"]
    assert "GPUs" in pages["/admin/jobs/job/"]
    assert "Max GPUs per job" in pages["/admin/quotas/teamquota/add/"]


def test_node_labels_and_a_model_versions_size_read_as_people_write_them(superuser, manager, teams, node):
    """Manager trial 15, F27: "Cpu count", "Memory mb", "Host cpu count", "Worker pid", and a model
    version's "Size: 6190186"."""
    from apps.registry.models import ModelVersion

    client = admin_client(superuser)
    page = client.get(f"/admin/cluster/node/{node.pk}/change/").content.decode()
    for wrong in ("Cpu count", "Memory mb", "Host cpu count", "Worker pid", "Host memory mb"):
        assert wrong not in page, wrong
    for right in ("CPU count", "Memory (MiB)", "Host CPU count", "Worker PID", "Host memory (MiB)"):
        assert right in page, right
    assert "CPU count" in client.get("/admin/cluster/node/").content.decode()

    version = ModelVersion.objects.create(team=teams["vision"], name="pcb", version=1, size=6190186)
    for viewer in (superuser, manager):
        shown = admin_client(viewer).get(f"/admin/registry/modelversion/{version.pk}/change/").content.decode()
        assert "5.9 MiB (6,190,186 bytes)" in shown and ">6190186<" not in shown
    assert "5.9 MiB (6,190,186 bytes)" in client.get("/admin/registry/modelversion/").content.decode()


def test_nobody_adds_jobs_or_their_records_in_admin(superuser):
    """Operator trial 20, F1: a superuser's "Add job" made a job with no parsed spec, which the
    scheduler placed and its worker failed with KeyError: 'resolved'."""
    client = admin_client(superuser)
    for model in ("jobs/job", "jobs/jobevent", "jobs/metricpoint", "jobs/logchunk", "jobs/checkpoint",
                  "quotas/usagerecord"):
        assert client.get(f"/admin/{model}/add/").status_code == 403, model
        assert f'href="/admin/{model}/add/"' not in client.get(f"/admin/{model}/").content.decode(), model


def test_a_job_that_may_still_run_is_not_deleted_until_it_has_ended(superuser, bob, node, demo_registered):
    """Operator trial 20, F2: deleting a running job in admin freed its GPUs while its training went
    on, and its worker then died on the missing row. Cancel first; an ended job may go."""
    from apps.jobs.services import attempt_start, job_cancel, job_claim

    client = admin_client(superuser)
    job = submit(bob, task_name="still-running")
    assert job_claim(job, node=node, gpu_indices=[0], gpu_share=1.0, run_class="medium")
    attempt_start(job_id=job.pk, attempt_id=Job.objects.get(pk=job.pk).attempt_id, node_name=node.name)

    html = client.post(f"/admin/jobs/job/{job.pk}/delete/", {"post": "yes"}, follow=True).content.decode()
    assert "Not deleted: job still-running is running: cancel it first" in html
    html = client.post("/admin/jobs/job/", {"action": "delete_selected", "_selected_action": [str(job.pk)],
                                            "post": "yes"}, follow=True).content.decode()
    assert Job.objects.filter(pk=job.pk).exists()
    assert "job still-running is running: cancel it first" in html

    queued = submit(bob, task_name="queued-one")
    client.post(f"/admin/jobs/job/{queued.pk}/delete/", {"post": "yes"})
    assert Job.objects.filter(pk=queued.pk).exists()
    assert job_cancel(job=Job.objects.get(pk=queued.pk), by=superuser)
    client.post(f"/admin/jobs/job/{queued.pk}/delete/", {"post": "yes"})
    assert not Job.objects.filter(pk=queued.pk).exists()  # cancelled: it may go


def posted_back(page: str) -> dict[str, list[str]]:
    """The hidden fields of a confirmation page's form, as the browser posts them back."""
    fields: dict[str, list[str]] = {}
    for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', page):
        fields.setdefault(name, []).append(value)
    return fields


def test_the_cancel_and_drain_pages_post_their_selection_back_with_the_reason(
    manager, superuser, bob, node, demo_registered
):
    """What the pages (admin/reason_confirmation.html) send, not a hand-made post, does the action."""
    job = submit(bob, task_name="to-cancel")
    client = admin_client(manager)
    page = client.post("/admin/jobs/job/", {"action": "cancel", "_selected_action": [str(job.pk)]}).content.decode()
    assert "Cancel these jobs" in page and "Home" in page
    client.post("/admin/jobs/job/", {**posted_back(page), "reason": "wrong dataset"})
    assert Job.objects.get(pk=job.pk).state == "cancelled"
    client = admin_client(superuser)
    page = client.post("/admin/cluster/node/", {"action": "drain", "_selected_action": [str(node.pk)]}).content.decode()
    assert 'value="Drain"' in page and ">Cancel</a>" in page
    client.post("/admin/cluster/node/", {**posted_back(page), "reason": "maintenance"})
    node.refresh_from_db()
    assert node.state == "draining" and node.drain_reason == "maintenance"


def test_moving_a_member_to_another_team_is_a_removal_and_an_addition(superuser, alice, bob, carol, teams,
                                                                      demo_registered):
    """Editing a membership's team (bob: vision → robotics) was saved as a plain row change: bob's
    queued job stayed queued in vision, charged to a team he no longer saw, with no word, and the
    audit had no removal (managers' admin week, trial30b). Now the move is refused while he leaves
    active jobs behind, saying what a removal would do; without them it is a removal from the old
    team and an addition to the new one, each audited as when done alone."""
    from apps.accounts.models import AuditEntry

    job = submit(bob, task_name="bobs-queued")
    membership = Membership.objects.get(user=bob, team=teams["vision"])
    client = admin_client(superuser)
    url = f"/admin/accounts/membership/{membership.pk}/change/"
    move = {"user": bob.pk, "team": teams["robotics"].pk, "role": "member"}
    response = client.post(url, move)
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert errors["team"] == ["Active jobs of bob in vision: 1 queued job will be cancelled. Moving is removing "
                              "from the old team: remove them from it in Memberships (which asks first) and add the "
                              "new membership, or cancel those jobs before."]
    assert list(Membership.objects.filter(user=bob).values_list("team__slug", flat=True)) == ["vision"]
    job.refresh_from_db()
    assert job.state == "queued"

    Job.objects.filter(pk=job.pk).update(state="cancelled")
    response = client.post(url, move)
    assert response.status_code == 302, response.context["adminform"].form.errors if response.context else ""
    assert list(Membership.objects.filter(user=bob).values_list("team__slug", flat=True)) == ["robotics"]
    assert AuditEntry.objects.filter(action=AuditEntry.Action.MEMBERSHIP_REMOVE, team=teams["vision"],
                                     data__user="bob").exists()
    assert AuditEntry.objects.filter(action=AuditEntry.Action.ROLE_CHANGE, team=teams["robotics"],
                                     data__user="bob", data__to="member").exists()


def test_deleting_the_last_manager_s_account_is_refused_naming_whom_to_make_manager(superuser, alice, bob, teams):
    """Deleting alice's account (vision's only manager) took her membership with it: "deleted
    successfully", and vision had nobody to manage it (managers' admin week, trial30b)."""
    client = admin_client(superuser)
    response = client.post(f"/admin/auth/user/{alice.pk}/delete/", {"post": "yes"}, follow=True)
    said = [str(m) for m in response.context["messages"]]
    assert said == ["not deleted: alice is the last manager of vision; make bob its manager first"]
    assert Membership.objects.filter(user=alice, team=teams["vision"], role="manager").exists()
    response = client.post("/admin/auth/user/", {"action": "delete_selected", "_selected_action": [alice.pk],
                                                  "post": "yes"})
    assert "alice is the last manager of vision; make bob its manager first" in response.content.decode()
    assert type(alice).objects.filter(pk=alice.pk).exists()
    # Once another manager is there, the account goes.
    Membership.objects.filter(user=bob).update(role="manager")
    assert client.post(f"/admin/auth/user/{alice.pk}/delete/", {"post": "yes"}).status_code == 302
    assert not type(alice).objects.filter(pk=alice.pk).exists()


@pytest.mark.parametrize("value", ["vision", "abc", "1.5", "99999999999999999999999", "robotics", "١"])
@pytest.mark.parametrize("url", ["/admin/jobs/job/", "/admin/accounts/membership/", "/admin/datasets/dataset/",
                                 "/admin/registry/modelversion/", "/admin/quotas/usagerecord/",
                                 "/admin/accounts/auditentry/"])
def test_a_team_filter_that_is_no_team_id_shows_nothing_and_says_so(manager, bob, teams, demo_registered, url,
                                                                    value):
    """``?team=vision`` (the name every other page uses) or a cut-off link: a ValueError in the
    query, a 500, on every team-scoped list (managers' admin week, trial30b)."""
    submit(bob, task_name="vision-job")
    response = admin_client(manager).get(f"{url}?team={value}")
    assert response.status_code == 200
    assert response.context["cl"].result_count == 0
    said = [str(m) for m in response.context["messages"]]
    hint = f" (team vision's filter is ?team={teams['vision'].pk})" if value == "vision" else ""
    assert said == [f"team={value!r} is not a team's id: nothing is shown{hint}; choose the team in the filter"]


HUGE = "99999999999999999999999"  # 23 digits: past a 64-bit column


@pytest.mark.parametrize(("who", "url", "query", "said"), [
    ("superuser", "/admin/jobs/job/", f"user={HUGE}", f"user={HUGE!r} is not the id of a user: nothing is shown"),
    ("manager", "/admin/jobs/job/", f"user={HUGE}", f"user={HUGE!r} is not the id of a user: nothing is shown"),
    ("superuser", "/admin/jobs/job/", f"user__id__exact={HUGE}",
     f"user__id__exact={HUGE!r} is not the id of a user: nothing is shown"),
    ("manager", "/admin/jobs/job/", "user=bob", "user='bob' is not the id of a user: nothing is shown"),
    ("superuser", "/admin/jobs/job/", f"node={HUGE}", f"node={HUGE!r} is not the id of a node: nothing is shown"),
    ("superuser", "/admin/cluster/node/", f"id__in=1,{HUGE}",
     f"id__in={HUGE!r} is not the id of a node: nothing is shown"),
    ("manager", "/admin/jobs/job/", f"memory_mb__gte={HUGE}",  # a plain integer column: no 500, no word either
     f"memory_mb__gte={HUGE!r} is not a whole number from 0 to {{high}}: nothing is shown"),
    ("superuser", "/admin/quotas/teamquota/", f"team={HUGE}",
     f"team={HUGE!r} is not the id of a team: nothing is shown"),
    ("manager", "/admin/quotas/teamquota/", f"team={HUGE}",
     f"team={HUGE!r} is not the id of a team: nothing is shown"),
    ("superuser", "/admin/notifications/channel/", f"team={HUGE}",
     f"team={HUGE!r} is not the id of a team: nothing is shown"),
    ("superuser", "/admin/notifications/channel/", f"team__id__exact={HUGE}",
     f"team__id__exact={HUGE!r} is not the id of a team: nothing is shown"),
    ("superuser", "/admin/accounts/membership/", f"user={HUGE}",
     f"user={HUGE!r} is not the id of a user: nothing is shown"),
    ("manager", "/admin/accounts/auditentry/", f"actor={HUGE}",
     f"actor={HUGE!r} is not the id of a user: nothing is shown"),
    ("superuser", "/admin/auth/user/", f"id={HUGE}", f"id={HUGE!r} is not the id of a user: nothing is shown"),
    ("superuser", "/admin/cluster/gpu/", f"node={HUGE}", f"node={HUGE!r} is not the id of a node: nothing is shown"),
])
def test_an_id_lookup_that_no_id_can_be_shows_nothing_and_says_so(request, bob, teams, demo_registered, who, url, query, said):
    """A 23-digit id in a related lookup (``?user=``, ``?team=``, the stock filters' ``__id__exact``)
    was an OverflowError, a 500, on SQLite: Django guards plain integer fields, not foreign keys
    (managers' admin week, trial30b). Every change list shows nothing and says why."""
    submit(bob, task_name="vision-job")
    response = admin_client(request.getfixturevalue(who)).get(f"{url}?{query}")
    assert response.status_code == 200
    assert response.context["cl"].result_count == 0
    high = connection.ops.integer_field_range("PositiveIntegerField")[1]  # SQLite: 2**63 - 1; PostgreSQL 2**31 - 1
    assert [str(m) for m in response.context["messages"]] == [said.format(high=high)]


def test_an_id_lookup_that_is_an_id_still_filters(superuser, bob, carol, teams, demo_registered):
    submit(bob, task_name="vision-job")
    client = admin_client(superuser)
    for query, count in [(f"user={bob.pk}", 1), (f"user={carol.pk}", 0), (f"user__id__exact={bob.pk}", 1),
                         ("user__isnull=False", 1), (f"team={teams['vision'].pk}", 1)]:
        response = client.get(f"/admin/jobs/job/?{query}")
        assert response.status_code == 200, query
        assert response.context["cl"].result_count == count, query
        assert not list(response.context["messages"]), query


def test_deleting_every_manager_s_account_at_once_is_refused(superuser, alice, bob, teams):
    """alice and bob both manage vision: each account alone may go (the other stays manager), both
    in one "delete selected" took every manager of vision with them, "deleted successfully" (review31)."""
    Membership.objects.filter(user=bob).update(role="manager")
    client = admin_client(superuser)
    response = client.post("/admin/auth/user/", {"action": "delete_selected",
                                                  "_selected_action": [alice.pk, bob.pk], "post": "yes"})
    assert response.status_code == 200
    assert "alice and bob are the last managers of vision" in response.content.decode()
    assert type(alice).objects.filter(pk__in=[alice.pk, bob.pk]).count() == 2


def test_removing_every_manager_of_a_team_at_once_is_refused_not_a_500(superuser, alice, bob, teams):
    """The same through Memberships' "delete selected": each membership alone passed the check, the
    second removal then raised in the delete, a 500 after the first was gone (review31)."""
    Membership.objects.filter(user=bob).update(role="manager")
    selected = list(Membership.objects.filter(team=teams["vision"]).values_list("pk", flat=True))
    client = admin_client(superuser)
    response = client.post("/admin/accounts/membership/", {"action": "delete_selected",
                                                            "_selected_action": selected, "post": "yes"})
    assert response.status_code == 200
    assert "alice and bob are the last managers of vision" in response.content.decode()
    assert Membership.objects.filter(team=teams["vision"], role="manager").count() == 2


def test_changing_a_member_row_s_user_on_the_team_page_replaces_them(superuser, alice, bob, carol, teams,
                                                                     demo_registered):
    """On vision's page, bob's row changed to carol added carol and kept bob: "changed", and bob still
    in vision, still seeing its jobs and data (the team page's side of trial30b's move, review31).
    Now it is bob's removal (asked about first: what he leaves behind) and carol's addition."""
    from apps.accounts.models import AuditEntry
    from tests.security.test_admin_audit import form_data

    job = submit(bob, task_name="bobs-queued")
    client = admin_client(superuser)
    url = f"/admin/accounts/team/{teams['vision'].pk}/change/"
    data = form_data(client, url)
    row = next(i for i in range(int(data["memberships-TOTAL_FORMS"]))
               if data.get(f"memberships-{i}-id") == str(Membership.objects.get(user=bob).pk))
    data[f"memberships-{row}-user"] = str(carol.pk)
    response = client.post(url, data)
    assert response.status_code == 200
    (formset,) = [inline.formset for inline in response.context["inline_admin_formsets"]]
    assert formset.non_form_errors() == ["Active jobs of bob in vision: 1 queued job will be cancelled. Remove bob "
                                         "from Memberships, which asks first, or cancel those jobs before."]
    assert sorted(Membership.objects.filter(team=teams["vision"]).values_list("user__username", flat=True)) == [
        "alice", "bob"]

    Job.objects.filter(pk=job.pk).update(state="cancelled")
    assert client.post(url, data).status_code == 302
    assert sorted(Membership.objects.filter(team=teams["vision"]).values_list("user__username", flat=True)) == [
        "alice", "carol"]
    assert AuditEntry.objects.filter(action=AuditEntry.Action.MEMBERSHIP_REMOVE, team=teams["vision"],
                                     data__user="bob").exists()


def test_a_superuser_s_job_edit_writes_only_what_it_changed(superuser, bob, teams):
    """The change form saved the whole row as read at the POST: what the scheduler or the worker wrote
    in between (the job ended: state, exit code) was written back over with the form's older copy, a
    finished job running again (review31). A concurrent writer is stood in for by a pre_save that
    commits their write just before the admin's."""
    from django.db.models.signals import pre_save

    from tests.jobs.factories import make_job
    from tests.security.test_admin_audit import form_data

    job = make_job(team=teams["vision"], user=bob, state=JobState.RUNNING)
    client = admin_client(superuser)
    url = f"/admin/jobs/job/{job.pk}/change/"
    data = form_data(client, url) | {"task_name": "renamed"}

    def worker_finishes(sender, instance, **kwargs):
        Job.objects.filter(pk=instance.pk).update(state=JobState.SUCCEEDED, exit_code=0)

    pre_save.connect(worker_finishes, sender=Job)
    try:
        assert client.post(url, data).status_code == 302
    finally:
        pre_save.disconnect(worker_finishes, sender=Job)
    job.refresh_from_db()
    assert (job.task_name, job.state, job.exit_code) == ("renamed", JobState.SUCCEEDED, 0)
