"""An object's History page in admin shows the project's audit entries about it and links them in
the audit log (trial 14, F39: it said the object had no change history)."""

from __future__ import annotations

import pytest

from apps.accounts.services import audit_record
from tests.conftest import admin_client
from tests.jobs.factories import make_job

pytestmark = pytest.mark.django_db


def test_a_jobs_history_shows_what_admin_actions_did_to_it_and_links_the_audit_log(manager, bob, carol, teams):
    job = make_job(team=teams["vision"], user=bob, task_name="bob-rq")
    other = make_job(team=teams["robotics"], user=carol, task_name="carol-q")
    client = admin_client(manager)
    client.post("/admin/jobs/job/", {"action": "make_high", "_selected_action": [str(job.pk)]})
    client.post("/admin/jobs/job/", {"action": "cancel", "_selected_action": [str(job.pk)], "apply": "yes", "reason": "r"})
    audit_record(actor=carol, action="job.cancel", team=teams["robotics"], target=other, message="carol's own")

    html = client.get(f"/admin/jobs/job/{job.pk}/history/").content.decode()
    # Each action's own entry (job.class, job.cancel); no second "admin.action" saying it again.
    assert "Audit log" in html and "job.class" in html and "job.cancel" in html and "admin.action" not in html
    assert "carol" not in html
    link = f"/admin/accounts/auditentry/?target_type=job&amp;target_id={job.pk}"
    assert link in html
    listing = client.get(link.replace("&amp;", "&"))
    assert listing.status_code == 200
    text = listing.content.decode()
    assert "job.cancel" in text and "carol&#x27;s own" not in text and "carol's own" not in text


def test_a_managers_history_page_hides_entries_of_teams_they_do_not_manage(manager, superuser, teams):
    vision = teams["vision"]
    audit_record(actor=superuser, action="quota.change", team=None, target=vision, message="site-wide note")
    audit_record(actor=superuser, action="admin.change", team=vision, target=vision, message="renamed vision")
    html = admin_client(manager).get(f"/admin/accounts/team/{vision.pk}/history/").content.decode()
    assert "renamed vision" in html and "site-wide note" not in html
    assert "site-wide note" in admin_client(superuser).get(f"/admin/accounts/team/{vision.pk}/history/").content.decode()


def history_rows(client, url: str) -> list[str]:
    """The "What" column of the History page's audit table, and the admin's own change messages."""
    import re
    from html import unescape

    html = client.get(url).content.decode()
    return [unescape(re.sub(r"<[^>]+>", "", cell)).strip() for cell in re.findall(r"<td>(.*?)</td>", html, re.S)]


def test_a_users_history_says_which_save_deactivated_and_which_reactivated(superuser, carol):
    """Both read "admin.change user carol by root" / "Changed Active." (manager trial 15, F6)."""
    from django.contrib.admin.models import LogEntry

    from apps.accounts.models import AuditEntry
    from tests.security.test_admin_audit import form_data

    client = admin_client(superuser)
    url = f"/admin/auth/user/{carol.pk}/change/"
    data = form_data(client, url)
    data.pop("is_active")
    assert client.post(url, data).status_code == 302
    assert client.post(url, form_data(client, url) | {"is_active": "on"}).status_code == 302

    entries = list(AuditEntry.objects.filter(action="admin.change", target_type="user").order_by("pk"))
    assert [e.message for e in entries] == ["user carol by root: deactivated", "user carol by root: reactivated"]
    assert [list(e.data["changes"]) for e in entries] == [["is_active"], ["is_active"]]
    assert [e.get_change_message() for e in LogEntry.objects.order_by("pk")] == ["Deactivated.", "Reactivated."]
    rows = history_rows(client, f"/admin/auth/user/{carol.pk}/history/")
    assert "user carol by root: deactivated" in rows and "Reactivated." in rows


def test_a_nodes_history_names_each_action_and_the_drain_reason(superuser, node):
    """Drain and resume read the same row, "admin.action node local by admin" (manager trial 15, F8)."""
    client = admin_client(superuser)
    changelist = "/admin/cluster/node/"
    client.post(changelist, {"action": "drain", "_selected_action": [str(node.pk)], "apply": "yes",
                             "reason": "GPU firmware update"})
    client.post(changelist, {"action": "resume", "_selected_action": [str(node.pk)]})
    rows = history_rows(client, f"/admin/cluster/node/{node.pk}/history/")
    assert "drain: node node-a by root: state 'active' → 'draining'; drain_reason '' → 'GPU firmware update'" in rows
    assert "resume: node node-a by root: state 'draining' → 'active'; drain_reason 'GPU firmware update' → ''" in rows


def test_an_admin_stage_action_is_audited_once_by_the_stage_move_itself(manager, teams):
    """Each stage action wrote "admin.action model version …" beside "model.promote …", which said
    it already (manager trial 15, F8): the service's entry is the one kept."""
    from apps.accounts.models import AuditEntry
    from apps.registry.models import ModelVersion

    version = ModelVersion.objects.create(team=teams["vision"], name="pcb", version=1)
    client = admin_client(manager)
    client.post("/admin/registry/modelversion/", {"action": "to_staging", "_selected_action": [str(version.pk)]})
    assert ModelVersion.objects.get(pk=version.pk).stage == "staging"
    entries = AuditEntry.objects.filter(target_type="modelversion", target_id=str(version.pk))
    assert [(e.action, e.message) for e in entries] == [("model.promote", "vision/pcb:v1: none → staging")]
