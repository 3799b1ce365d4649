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
    client.post("/admin/jobs/job/", {"action": "cancel", "_selected_action": [str(job.pk)]})
    audit_record(actor=carol, action="job.cancel", team=teams["robotics"], target=other, message="carol's own")

    html = client.get(f"/admin/jobs/job/{job.pk}/history/").content.decode()
    assert "Audit log" in html and "job.cancel" in html and "admin.action" in html
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
