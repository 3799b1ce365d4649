"""Findings 2, 3 and 9: what managers may change in admin, and every admin change leaves an audit entry."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.contrib.admin.widgets import AdminSplitDateTime
from django.test import Client

from apps.accounts.models import AuditEntry, Membership
from apps.cluster.models import Node
from apps.jobs.models import Job, JobState
from tests.conftest import SEED_SPEC, admin_client, api_client, make_user
from tests.jobs.factories import make_job

pytestmark = pytest.mark.django_db


def form_data(client: Client, url: str) -> dict:
    """What the browser would send back for the change form at ``url``, unchanged (inlines included)."""
    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    forms = [response.context["adminform"].form]
    data = {}
    for inline in response.context["inline_admin_formsets"]:
        formset = inline.formset
        management = formset.management_form
        data.update({management.add_prefix(name): management[name].value() for name in management.fields})
        forms += formset.forms
    for form in forms:
        for name, field in form.fields.items():
            value = form[name].value()
            key = form.add_prefix(name)
            if value is None or value is False:
                continue
            if isinstance(field.widget, AdminSplitDateTime):
                date, time = field.widget.decompress(value)
                data[f"{key}_0"], data[f"{key}_1"] = str(date), str(time)
            elif isinstance(value, (list, tuple)):
                data[key] = [str(v) for v in value]
            elif value is True:
                data[key] = "on"
            else:
                data[key] = str(value)
    return data


def entries(action: str, **filters) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(action=action, **filters).order_by("id"))


# --- finding 2: managers cannot edit jobs in admin; superuser edits are audited ---------------

ALLOCATION_FIELDS = ["gpus", "run_class", "timeout_s", "retries_left", "exit_code", "gpu_memory_mb", "cpu_milli",
                     "memory_mb", "priority_class", "cancel_requested_at", "first_started_at", "epochs_done"]


def test_a_manager_sees_a_running_job_read_only(manager, bob, teams):
    job = make_job(team=teams["vision"], user=bob, state=JobState.RUNNING, gpus=2)
    client = admin_client(manager)
    html = client.get(f"/admin/jobs/job/{job.pk}/change/").content.decode()
    for field in ALLOCATION_FIELDS:
        assert f'name="{field}"' not in html, field
    response = client.post(f"/admin/jobs/job/{job.pk}/change/",
                           {"task_name": "t", "gpus": "0.25", "run_class": "low", "timeout_s": "1",
                            "retries_left": "5", "priority_class": "urgent"})
    assert response.status_code == 403
    job.refresh_from_db()
    assert (job.gpus, job.retries_left, job.timeout_s, job.priority_class) == (2, 0, 3600, "medium")


def test_a_manager_still_cancels_and_requeues_with_the_admin_actions_and_both_are_audited(manager, bob, teams):
    queued = make_job(team=teams["vision"], user=bob)
    running = make_job(team=teams["vision"], user=bob, state=JobState.RUNNING)
    client = admin_client(manager)
    client.post("/admin/jobs/job/", {"action": "cancel", "_selected_action": [str(queued.pk)], "apply": "yes", "reason": "r"})
    client.post("/admin/jobs/job/", {"action": "requeue", "_selected_action": [str(running.pk)]})
    assert Job.objects.get(pk=queued.pk).state == JobState.CANCELLED
    assert Job.objects.get(pk=running.pk).attempt == 2
    assert [e.actor_name for e in entries("job.requeue", target_id=str(running.pk))] == ["alice"]
    assert [e.actor_name for e in entries("job.cancel", target_id=str(queued.pk))] == ["alice"]
    # The service's entries are the record: an "admin.action" beside each said it again (manager trial 15, F8).
    assert not entries("admin.action")


def test_a_superuser_edit_of_a_queued_job_is_audited_with_before_and_after(superuser, bob, teams):
    # Queued: a placed job's resources are read-only (fix31a; tests/portal/test_admin_writes.py).
    job = make_job(team=teams["vision"], user=bob, state=JobState.QUEUED, gpus=2)
    client = admin_client(superuser)
    url = f"/admin/jobs/job/{job.pk}/change/"
    data = form_data(client, url) | {"gpus": "1", "retries_left": "3"}
    response = client.post(url, data)
    assert response.status_code == 302, response.context["adminform"].form.errors if response.context else ""
    job.refresh_from_db()
    assert (job.gpus, job.retries_left) == (1, 3)
    (entry,) = entries("admin.change", target_id=str(job.pk))
    assert entry.actor_name == "root" and entry.team_id == teams["vision"].pk
    assert entry.data["changes"] == {"gpus": {"from": 2.0, "to": 1.0}, "retries_left": {"from": 0, "to": 3}}
    assert entry.message == f"job {job} by root: gpus 2.0 → 1.0; retries_left 0 → 3"


def test_a_save_that_changes_nothing_records_nothing(superuser, bob, teams):
    job = make_job(team=teams["vision"], user=bob)
    client = admin_client(superuser)
    url = f"/admin/jobs/job/{job.pk}/change/"
    assert client.post(url, form_data(client, url)).status_code == 302
    assert not entries("admin.change")


def test_saving_a_user_unchanged_records_nothing(superuser, bob):
    """Their last_login and date_joined lost their microseconds to the form: recorded as changes (trial 15, F6)."""
    from django.utils import timezone

    type(bob).objects.filter(pk=bob.pk).update(last_login=timezone.now())
    client = admin_client(superuser)
    url = f"/admin/auth/user/{bob.pk}/change/"
    response = client.post(url, form_data(client, url))
    assert response.status_code == 302, response.context["adminform"].form.errors if response.context else ""
    assert not entries("admin.change", target_id=str(bob.pk))


def test_every_registered_admin_is_audited():
    from apps.accounts.admin_audit import AuditedModelAdmin

    unaudited = [type(model_admin).__name__ for model_admin in admin.site._registry.values()
                 if not isinstance(model_admin, AuditedModelAdmin)]
    assert not unaudited


def test_adds_deletes_inlines_and_actions_are_audited(superuser, teams, node):
    client = admin_client(superuser)
    # add
    client.post("/admin/accounts/team/add/", {"slug": "lab", "name": "Lab", "shares": "1", "urgent_by": "members",
                                              "memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0"})
    (added,) = entries("admin.add")
    assert added.data["changes"]["slug"] == {"from": None, "to": "lab"}
    # inline: add a member to vision through the team page
    user = make_user("erin", None)
    url = f"/admin/accounts/team/{teams['vision'].pk}/change/"
    data = form_data(client, url)
    total = int(data["memberships-TOTAL_FORMS"])
    data |= {"memberships-TOTAL_FORMS": str(total + 1), f"memberships-{total}-user": str(user.pk),
             f"memberships-{total}-role": "member", f"memberships-{total}-team": str(teams["vision"].pk)}
    assert client.post(url, data).status_code == 302
    assert Membership.objects.filter(user=user, team=teams["vision"]).exists()
    inline = [e for e in entries("admin.add") if e.target_type == "membership"]
    assert inline and inline[0].team_id == teams["vision"].pk
    # action
    client.post("/admin/cluster/node/", {"action": "drain", "_selected_action": [str(node.pk)], "apply": "yes", "reason": "maintenance"})
    assert [e.data["action"] for e in entries("admin.action", target_type="node")] == ["drain"]
    # delete (a live node is not deleted: its worker stops first, which marks it lost)
    Node.objects.filter(pk=node.pk).update(state=Node.State.LOST)
    client.post(f"/admin/cluster/node/{node.pk}/delete/", {"post": "yes"})
    (deleted,) = entries("admin.delete", target_type="node")
    assert deleted.data["before"]["name"] == "node-a"


# --- audit entries are immutable and view-only -----------------------------------------------


def test_audit_entries_are_view_only_in_admin_even_for_superusers(superuser, manager, teams, carol):
    from apps.accounts.services import audit_record

    mine = audit_record(actor=carol, action="job.submit", team=teams["vision"], message="original")
    other = audit_record(actor=carol, action="job.submit", team=teams["robotics"], message="robotics")
    html = admin_client(manager).get("/admin/accounts/auditentry/").content.decode()
    assert "original" in html and "robotics" not in html
    for user in (manager, superuser):
        client = admin_client(user)
        assert client.get(f"/admin/accounts/auditentry/{mine.pk}/change/").status_code == 200
        assert client.post(f"/admin/accounts/auditentry/{mine.pk}/change/", {"message": "edited"}).status_code == 403
        assert client.post(f"/admin/accounts/auditentry/{mine.pk}/delete/", {"post": "yes"}).status_code == 403
        assert client.get("/admin/accounts/auditentry/add/").status_code == 403
    mine.refresh_from_db()
    assert mine.message == "original" and AuditEntry.objects.filter(pk=other.pk).exists()


def test_audit_entries_refuse_updates_and_deletes_in_code(carol, teams):
    from apps.accounts.services import audit_record

    entry = audit_record(actor=carol, action="job.submit", team=teams["vision"], message="original")
    entry.message = "edited"
    with pytest.raises(PermissionError):
        entry.save()
    with pytest.raises(PermissionError):
        entry.delete()
    with pytest.raises(PermissionError):
        AuditEntry.objects.filter(pk=entry.pk).update(message="edited")
    with pytest.raises(PermissionError):
        AuditEntry.objects.filter(pk=entry.pk).delete()
    assert AuditEntry.objects.get(pk=entry.pk).message == "original"


# --- finding 3: quotas and urgent allowance are superuser-only --------------------------------

QUOTA_FIELDS = ["max_gpus", "max_gpus_per_job", "user_gpu_hours_per_day", "urgent_gpu_hours_per_day",
                "urgent_max_gpus"]


def test_a_manager_cannot_raise_their_teams_quota(manager, teams):
    from apps.quotas.models import TeamQuota

    quota = TeamQuota.objects.create(team=teams["vision"], max_gpus=2, urgent_gpu_hours_per_day=1)
    client = admin_client(manager)
    html = client.get(f"/admin/quotas/teamquota/{quota.pk}/change/").content.decode()
    assert "urgent_gpu_hours_per_day" in html or "Urgent gpu hours per day" in html  # they may read it
    # ...and what is in force, with where it comes from: an empty field read "-" (manager trial F36).
    assert "max GPUs: 2 (this team)" in html and "urgent GPU-hours per day: 1 (this team)" in html
    assert "user GPU-hours per day: 20 (site default)" in html and "max GPUs per job: no limit (site default)" in html
    for field in QUOTA_FIELDS:
        assert f'name="{field}"' not in html, field
    body = {"team": teams["vision"].pk, "max_gpus": "64", "urgent_gpu_hours_per_day": "1000"}
    assert client.post(f"/admin/quotas/teamquota/{quota.pk}/change/", body).status_code == 403
    assert client.post("/admin/quotas/teamquota/add/", body).status_code == 403
    quota.refresh_from_db()
    assert (quota.max_gpus, quota.urgent_gpu_hours_per_day) == (2, 1)


def test_a_manager_cannot_create_a_quota_for_a_team_without_one(manager, teams):
    from apps.quotas.models import TeamQuota

    response = admin_client(manager).post("/admin/quotas/teamquota/add/",
                                          {"team": teams["vision"].pk, "urgent_max_gpus": "64"})
    assert response.status_code == 403 and not TeamQuota.objects.exists()


def test_a_superuser_sets_a_quota_and_it_is_audited_with_before_and_after(superuser, teams):
    from apps.quotas.models import TeamQuota

    quota = TeamQuota.objects.create(team=teams["vision"], max_gpus=2)
    client = admin_client(superuser)
    url = f"/admin/quotas/teamquota/{quota.pk}/change/"
    assert client.post(url, form_data(client, url) | {"max_gpus": "4"}).status_code == 302
    (entry,) = entries("quota.change")
    assert entry.data["changes"] == {"max_gpus": {"from": 2.0, "to": 4.0}}
    # Said once: it read "quota.change team quota quota of vision by root" (manager trial F26).
    assert entry.message == "quota of vision by root: max_gpus 2.0 → 4.0"


@pytest.mark.parametrize(("values", "field", "words"), [
    ({"max_gpus": "-1"}, "max_gpus", "greater than or equal to 0"),
    ({"max_gpus_per_job": "0"}, "max_gpus_per_job", "greater than or equal to 0.01"),
    ({"user_gpu_hours_per_day": "-5"}, "user_gpu_hours_per_day", "greater than or equal to 0"),
    ({"urgent_gpu_hours_per_day": "-1"}, "urgent_gpu_hours_per_day", "greater than or equal to 0"),
    ({"urgent_max_gpus": "-3"}, "urgent_max_gpus", "greater than or equal to 0"),
    ({"max_gpus": "0.5", "urgent_max_gpus": "5"}, "urgent_max_gpus", "may not exceed max GPUs (0.5)"),
    ({"max_gpus": "2", "max_gpus_per_job": "4"}, "max_gpus_per_job", "could never start"),
])
def test_a_quota_that_could_not_work_is_refused_at_its_field(values, field, words, superuser, teams):
    """A manager trial saved -1, 0, -5 GPUs/hours without a word; the scheduler then showed a
    quota of -5 GPU-hours and refused every job of the team."""
    from apps.quotas.models import TeamQuota

    client = admin_client(superuser)
    url = "/admin/quotas/teamquota/add/"
    response = client.post(url, form_data(client, url) | {"team": teams["robotics"].pk, **values})
    assert response.status_code == 200 and not TeamQuota.objects.exists()
    errors = response.context["adminform"].form.errors
    assert list(errors) == [field] and words in errors[field][0], errors


@pytest.mark.parametrize("shares", ["0", "-2"])
def test_team_shares_of_zero_or_below_are_refused_at_their_field(superuser, teams, shares):
    """Saved without a word, then taken as 1 by the scheduler while admin showed 0 (manager trial 15, F28)."""
    client = admin_client(superuser)
    url = f"/admin/accounts/team/{teams['vision'].pk}/change/"
    response = client.post(url, form_data(client, url) | {"shares": shares})
    assert response.status_code == 200 and "shares" in response.context["adminform"].form.errors
    teams["vision"].refresh_from_db()
    assert teams["vision"].shares == 1.0


def test_a_negative_storage_quota_is_refused(superuser, teams):
    client = admin_client(superuser)
    url = f"/admin/accounts/team/{teams['vision'].pk}/change/"
    response = client.post(url, form_data(client, url) | {"storage_quota_gb": "-1"})
    assert response.status_code == 200 and "storage_quota_gb" in response.context["adminform"].form.errors
    teams["vision"].refresh_from_db()
    assert teams["vision"].storage_quota_gb is None


# --- finding 9: deletes are audited, versions are never reused, a deleted dataset is gone -------


@pytest.fixture
def weights(tmp_path, settings):
    settings.JOBS_DIR = tmp_path / "jobs"
    path = settings.JOBS_DIR / "w" / "best.pt"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"weights")
    return path


def register(job_team, user, weights):
    from apps.registry.services import model_register

    job = make_job(team=job_team, user=user, state=JobState.SUCCEEDED, task_name="pcb")
    return model_register(job=job, weights=weights, metrics={})


def test_a_model_version_an_active_job_uses_is_not_deleted(manager, bob, teams, weights):
    """A production version deleted while a fine-tune waited: the job then trained from it anyway
    (manager trial). Refused on the confirmation page, in bulk and in the service alike."""
    from apps.core.guards import InUse
    from apps.registry.services import model_version_delete

    version = register(teams["vision"], bob, weights)
    waiting = make_job(team=teams["vision"], user=bob, task_name="ft-prod")
    Job.objects.filter(pk=waiting.pk).update(spec={**waiting.spec, "inputs": {"model": version.as_parent()}})
    page = admin_client(manager).post(f"/admin/registry/modelversion/{version.pk}/delete/", {"post": "yes"},
                                      follow=True)
    assert "Not deleted: model pcb:v1 is used by 1 active job of the team (ft-prod (queued))" \
        in page.content.decode()
    bulk = admin_client(manager).post("/admin/registry/modelversion/", {
        "action": "delete_selected", "_selected_action": [str(version.pk)], "post": "yes"})
    assert bulk.status_code == 200 and "ft-prod (queued)" in bulk.content.decode()  # listed as protected
    with pytest.raises(InUse, match="cancel it or let it finish first"):
        model_version_delete(version=version, by=manager)
    assert type(version).objects.filter(pk=version.pk).exists() and not entries("model.delete")
    Job.objects.filter(pk=waiting.pk).update(state=JobState.CANCELLED)
    model_version_delete(version=version, by=manager)
    assert not type(version).objects.filter(pk=version.pk).exists()


def test_a_deleted_model_versions_number_is_never_issued_again(manager, bob, teams, weights):
    first, second = register(teams["vision"], bob, weights), register(teams["vision"], bob, weights)
    assert (first.version, second.version) == (1, 2)
    response = admin_client(manager).post(f"/admin/registry/modelversion/{second.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert register(teams["vision"], bob, weights).version == 3
    (entry,) = entries("model.delete")
    assert (entry.actor_name, entry.team_id, entry.data["version"]) == ("alice", teams["vision"].pk, 2)


def test_versions_are_counted_per_team_and_name(bob, carol, teams, weights):
    assert register(teams["vision"], bob, weights).version == 1
    assert register(teams["robotics"], carol, weights).version == 1


def test_a_bulk_delete_of_model_versions_is_audited_per_version(manager, bob, teams, weights):
    versions = [register(teams["vision"], bob, weights) for _ in range(2)]
    admin_client(manager).post("/admin/registry/modelversion/", {
        "action": "delete_selected", "_selected_action": [str(v.pk) for v in versions], "post": "yes"})
    assert sorted(e.data["version"] for e in entries("model.delete")) == [1, 2]


@pytest.fixture
def uploaded(bob, teams, settings, tmp_path):
    from apps.datasets.services import dataset_upload
    from tests.datasets.archives import make_zip, upload, valid_files

    settings.DATASETS_DIR = tmp_path / "datasets"
    content = make_zip(valid_files())
    return dataset_upload(user=bob, team=teams["vision"], name="pcb", upload=upload(content), size=len(content)).dataset


def test_a_deleted_dataset_cannot_be_trained_on_and_the_delete_is_audited(manager, bob, uploaded, settings):
    folder = settings.DATASETS_DIR / "vision" / "pcb"
    assert folder.is_dir()
    spec = SEED_SPEC.replace("data=demo", "data=pcb")
    job = api_client(bob).post("/api/v1/jobs/", spec, content_type="application/yaml")
    assert job.status_code == 201
    # While that job waits to train on it, the version stays (it failed later with "dataset YAML
    # not found … check the dataset" as if its owner's data were wrong: manager trial).
    refused = admin_client(manager).post(f"/admin/datasets/dataset/{uploaded.pk}/delete/", {"post": "yes"},
                                         follow=True)
    assert refused.redirect_chain[-1][0].endswith(f"/admin/datasets/dataset/{uploaded.pk}/change/") and folder.is_dir()
    assert "Not deleted: dataset pcb:v1 is used by 1 active job of the team (" in refused.content.decode()
    response = api_client(manager).delete(f"/api/v1/datasets/{uploaded.pk}/")
    assert response.status_code == 409 and "cancel it or let it finish first" in response.json()["detail"]
    assert api_client(bob).post(f"/api/v1/jobs/{job.json()['id']}/cancel/").status_code == 202
    response = admin_client(manager).post(f"/admin/datasets/dataset/{uploaded.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert not folder.exists()
    for reference in ("pcb", "pcb/data.yaml"):
        again = SEED_SPEC.replace("data=demo", f"data={reference}")
        response = api_client(bob).post("/api/v1/jobs/", again, content_type="application/yaml")
        assert response.status_code == 400 and "command.data" in response.json(), reference
    (entry,) = entries("dataset.delete")
    assert (entry.actor_name, entry.data["name"]) == ("alice", "pcb")


def test_hidden_folders_in_team_storage_are_not_trainable(bob, uploaded, settings):
    hidden = settings.DATASETS_DIR / "vision" / ".upload-abc"
    (settings.DATASETS_DIR / "vision" / "pcb").rename(hidden)
    spec = SEED_SPEC.replace("data=demo", "data=.upload-abc/data.yaml")
    response = api_client(bob).post("/api/v1/jobs/", spec, content_type="application/yaml")
    assert response.status_code == 400 and "command.data" in response.json()


def test_membership_deletes_are_audited_on_both_admin_pages(manager, bob, teams, superuser):
    erin = make_user("erin", teams["vision"])
    membership = Membership.objects.get(user=bob, team=teams["vision"])
    client = admin_client(manager)
    assert client.post(f"/admin/accounts/membership/{membership.pk}/delete/", {"post": "yes"}).status_code == 302
    url = f"/admin/accounts/team/{teams['vision'].pk}/change/"
    data = form_data(client, url)
    index = next(i for i in range(int(data["memberships-TOTAL_FORMS"]))
                 if data.get(f"memberships-{i}-id") == str(Membership.objects.get(user=erin).pk))
    data[f"memberships-{index}-DELETE"] = "on"
    assert client.post(url, data).status_code == 302
    removed = entries("membership.remove")
    assert [(e.actor_name, e.data["user"]) for e in removed] == [("alice", "bob"), ("alice", "erin")]
    assert not Membership.objects.filter(user__in=[bob, erin]).exists()


# --- trial 14, F1/F2: job actions say per job what they did, and a no-op is not audited --------

def test_job_actions_name_each_job_they_left_alone_and_audit_only_what_changed(manager, bob, teams):
    queued = make_job(team=teams["vision"], user=bob, task_name="bob-e3")
    running = make_job(team=teams["vision"], user=bob, task_name="bob-rq", state=JobState.RUNNING)
    client = admin_client(manager)

    def act(action: str, *jobs: Job) -> str:
        response = client.post("/admin/jobs/job/", {"action": action, "_selected_action": [str(j.pk) for j in jobs]},
                               follow=True)
        return " | ".join(str(m) for m in response.context["messages"])

    said = act("requeue", queued)
    assert said == "left alone: bob-e3 is queued, not running: not requeued"
    said = act("make_low", running)
    assert said == "left alone: bob-rq is running: class not changed (only queued jobs and active sweeps change class)"
    said = act("make_medium", queued)
    assert said == "left alone: bob-e3 is already medium"
    assert Job.objects.get(pk=running.pk).priority_class == "medium"
    assert not entries("admin.action")  # three no-ops, no entry

    said = act("make_urgent", queued, running)
    assert said == ("1 job(s) set to class urgent: bob-e3 | "
                    "left alone: bob-rq is running: class not changed (only queued jobs and active sweeps change class)")
    assert Job.objects.get(pk=queued.pk).priority_class == "urgent"
    assert [e.target_id for e in entries("job.class")] == [str(queued.pk)]
    assert not entries("admin.action")  # the job.class entry is the record (manager trial 15, F8)


def test_a_zero_half_life_is_refused_at_its_field_in_the_forms_words(superuser):
    """It said "half_life_s must be > 0" above the form, on a field labelled Half life hours (F26)."""
    from apps.scheduling.models import SchedulerConfig

    config = SchedulerConfig.current()
    client = admin_client(superuser)
    url = f"/admin/scheduling/schedulerconfig/{config.pk}/change/"
    response = client.post(url, form_data(client, url) | {"half_life_hours": "0"})
    assert response.status_code == 200
    form = response.context["adminform"].form
    assert list(form.errors) == ["half_life_hours"], form.errors
    assert "half_life_s" not in response.content.decode()


def test_a_deleted_jobs_entry_names_it_by_its_id(superuser, bob, teams):
    """Operator trial 20, F3: the entry read "job long-1 (None) by admin" (its text was made after
    the row, and with it the primary key, had gone)."""
    from apps.jobs.services import job_cancel

    job = make_job(team=teams["vision"], user=bob, task_name="long-1")
    assert job_cancel(job=job, by=superuser)
    admin_client(superuser).post(f"/admin/jobs/job/{job.pk}/delete/", {"post": "yes"})
    (deleted,) = entries("admin.delete", target_type="job")
    assert deleted.message == f"job long-1 ({job.pk}) by root"


def test_what_the_services_own_is_read_only_on_a_job_even_to_a_superuser(superuser, bob, teams):
    """A superuser's change form offered a queued job's team and user (the job would run in a team its
    owner is not in, on the data it resolved in the other: vision's dataset under robotics), its
    class (set past the class rules: no event, a sweep's trials left behind; the actions do it), and what
    workers and the scheduler write (run_class, exit_code, epochs_done, logs_key: the archived logs'
    key, log_bytes, is_sweep, parent) (managers' admin week, trial30b). The resources, timeout and
    retries stay a superuser's to edit, audited."""
    job = make_job(team=teams["vision"], user=bob, gpus=2)
    client = admin_client(superuser)
    url = f"/admin/jobs/job/{job.pk}/change/"
    form = client.get(url).context["adminform"].form
    owned = {"team", "user", "priority_class", "run_class", "runtime_signature", "idempotency_key", "exit_code",
             "logs_key", "epochs_done", "is_sweep", "parent", "log_bytes"}
    assert not owned & set(form.fields), sorted(owned & set(form.fields))
    assert {"gpus", "timeout_s", "retries_left", "task_name"} <= set(form.fields)
    data = form_data(client, url) | {"team": str(teams["robotics"].pk), "priority_class": "urgent", "logs_key": "x"}
    assert client.post(url, data).status_code == 302
    job.refresh_from_db()
    assert (job.team_id, job.priority_class, job.logs_key) == (teams["vision"].pk, "medium", "")
