"""Admin change pages over rows other processes write (fix31a): a save writes what its form
changed and nothing else; what changed under it between the form's checks and the save is
said, not a 500.

Another process's write is stood in for by a ``post_init`` receiver that commits it right after
the admin's POST has read the row (Django's ``get_object``), before its save: the window of a
real worker, scheduler or other admin. No component of ours is mocked."""

from __future__ import annotations

import contextlib
import traceback

import pytest
from django.contrib.messages import get_messages
from django.db.models.signals import post_init

from apps.accounts.models import Membership
from apps.cluster.models import Node
from apps.jobs.models import Job, JobState
from tests.conftest import admin_client
from tests.jobs.factories import make_job
from tests.security.test_admin_audit import form_data

pytestmark = pytest.mark.django_db


@contextlib.contextmanager
def written_after_the_read(model, write):
    """``write(pk)`` once, right after the change view read the ``model`` row it saves (Django's
    ``_changeform_view`` → ``get_object``; an earlier read, UnseenAsMissing's, is not that one)."""
    done = []

    def meanwhile(sender, instance, **kwargs):
        if done or instance.pk is None:
            return
        names = [frame.name for frame in traceback.extract_stack()]
        if "_changeform_view" not in names or "get_object" not in names[names.index("_changeform_view") :]:
            return
        done.append(instance.pk)
        write(instance.pk)

    post_init.connect(meanwhile, sender=model)
    try:
        yield done
    finally:
        post_init.disconnect(meanwhile, sender=model)


def said(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_a_node_page_saved_unchanged_keeps_what_its_worker_wrote_meanwhile(superuser, node):
    """Every node field is read-only, yet a Save wrote the whole row back as read at the POST: the
    worker's state and heartbeat written in between were undone (a lost node "active" again)."""
    client = admin_client(superuser)
    url = f"/admin/cluster/node/{node.pk}/change/"
    data = form_data(client, url)
    with written_after_the_read(
        Node, lambda pk: Node.objects.filter(pk=pk).update(state=Node.State.LOST, storage_problem="disk full")
    ) as done:
        assert client.post(url, data).status_code == 302
    assert done == [node.pk]
    node.refresh_from_db()
    assert (node.state, node.storage_problem) == (Node.State.LOST, "disk full")


def test_a_dataset_edit_keeps_a_re_registration_s_hash_and_statistics(superuser, teams, demo_registered):
    """Re-registering a data.yaml rewrites the version's hash, size and statistics in place
    (dataset_register); an admin's edit of its description wrote the old ones back."""
    from apps.datasets.models import Dataset

    dataset = Dataset.objects.get(team=teams["vision"], name="demo")
    client = admin_client(superuser)
    url = f"/admin/datasets/dataset/{dataset.pk}/change/"
    data = form_data(client, url) | {"description": "belt camera, 2026"}
    with written_after_the_read(
        Dataset, lambda pk: Dataset.objects.filter(pk=pk).update(sha256="f" * 64, num_images=999)
    ) as done:
        response = client.post(url, data)
    assert response.status_code == 302, response.context["adminform"].form.errors if response.context else ""
    assert done
    dataset.refresh_from_db()
    assert (dataset.description, dataset.sha256, dataset.num_images) == ("belt camera, 2026", "f" * 64, 999)


def test_a_model_version_page_saved_keeps_a_promotion_made_meanwhile(superuser, teams):
    """The stage changes through the services (portal, API, the actions): a Save of the version's
    page wrote back the stage read at the POST over a promotion made in between."""
    from apps.registry.models import ModelVersion, Stage

    version = ModelVersion.objects.create(team=teams["vision"], name="belt", version=1, weights_key="models/x.pt")
    client = admin_client(superuser)
    url = f"/admin/registry/modelversion/{version.pk}/change/"
    data = form_data(client, url)
    with written_after_the_read(
        ModelVersion, lambda pk: ModelVersion.objects.filter(pk=pk).update(stage=Stage.PRODUCTION)
    ) as done:
        assert client.post(url, data).status_code == 302
    assert done
    version.refresh_from_db()
    assert version.stage == Stage.PRODUCTION


def test_two_admins_editing_the_scheduler_configuration_keep_both_changes(superuser):
    """One admin's Save wrote back every field as read at its POST, undoing another admin's
    change of another field made in between."""
    from apps.scheduling.models import SchedulerConfig

    config = SchedulerConfig.current()
    client = admin_client(superuser)
    url = f"/admin/scheduling/schedulerconfig/{config.pk}/change/"
    data = form_data(client, url) | {"weight_age": "123"}
    with written_after_the_read(
        SchedulerConfig, lambda pk: SchedulerConfig.objects.filter(pk=pk).update(half_life_hours=3.0)
    ) as done:
        response = client.post(url, data)
    assert response.status_code == 302, response.context["adminform"].form.errors if response.context else ""
    assert done
    config.refresh_from_db()
    assert (config.weight_age, config.half_life_hours) == (123, 3.0)


def test_a_running_job_s_resources_are_read_only_and_the_page_says_why(superuser, bob, teams):
    """A superuser could set gpus of a job already holding its GPUs: its allocation (gpu_indices)
    no longer matched its count, and its usage was charged by the new one (review31)."""
    job = make_job(team=teams["vision"], user=bob, state=JobState.RUNNING, gpus=1)
    client = admin_client(superuser)
    url = f"/admin/jobs/job/{job.pk}/change/"
    response = client.get(url)
    assert 'name="gpus"' not in response.content.decode() and 'name="task_name"' in response.content.decode()
    assert (
        "gpus, gpu_memory_mb, cpu_milli, memory_mb are read-only: job t is running (they change only while a "
        "job is queued; its GPUs are allocated by them)"
    ) in said(response)
    # Posted anyway (a page opened while it was queued, or by hand): refused and said, not dropped in
    # silence with "changed successfully" (review32).
    data = form_data(client, url) | {"gpus": "4", "task_name": "renamed"}
    response = client.post(url, data)
    assert response.status_code == 302 and response["Location"] == url
    assert "gpus not changed: job t is running now" in " ".join(said(response))
    job.refresh_from_db()
    assert (job.gpus, job.task_name) == (1, "t")
    del data["gpus"]
    assert client.post(url, data).status_code == 302
    job.refresh_from_db()
    assert (job.gpus, job.task_name) == (1, "renamed")

    queued = make_job(team=teams["vision"], user=bob, task_name="q", gpus=1)
    url = f"/admin/jobs/job/{queued.pk}/change/"
    assert 'name="gpus"' in client.get(url).content.decode()
    assert client.post(url, form_data(client, url) | {"gpus": "2"}).status_code == 302
    queued.refresh_from_db()
    assert queued.gpus == 2


def test_a_queued_job_placed_while_its_resources_were_edited_keeps_them(superuser, bob, teams):
    """The form offered gpus (queued at the GET and at the POST's read); the scheduler placed the job
    before the save: refused on the locked row, said, nothing of the edit kept."""
    job = make_job(team=teams["vision"], user=bob, task_name="q", gpus=1)
    client = admin_client(superuser)
    url = f"/admin/jobs/job/{job.pk}/change/"
    data = form_data(client, url) | {"gpus": "2", "task_name": "renamed"}
    with written_after_the_read(Job, lambda pk: Job.objects.filter(pk=pk).update(state=JobState.STARTING)) as done:
        response = client.post(url, data)
    assert done
    assert response.status_code == 302 and response["Location"] == url
    assert (
        "gpus not changed: job q is starting now (the scheduler placed it meanwhile); resources change only "
        "while it is queued"
    ) in said(response)
    job.refresh_from_db()  # (the stand-in's write shared the refused request's transaction: undone with it)
    assert (job.gpus, job.task_name) == (1, "q")


def test_a_membership_moved_after_another_admin_removed_it_is_said_not_a_500(superuser, bob, teams):
    """The move read the row again with .get(): removed between the form's checks and the save,
    a DoesNotExist, a 500."""
    membership = Membership.objects.get(user=bob, team=teams["vision"])
    client = admin_client(superuser)
    client.raise_request_exception = False
    url = f"/admin/accounts/membership/{membership.pk}/change/"
    move = {"user": bob.pk, "team": teams["robotics"].pk, "role": "member"}
    with written_after_the_read(Membership, lambda pk: Membership.objects.filter(pk=pk).delete()) as done:
        response = client.post(url, move)
    assert done
    assert response.status_code == 302
    assert (
        "nothing moved: this membership was removed meanwhile (by another admin or a service); add bob to "
        "robotics instead"
    ) in said(response)
    assert not Membership.objects.filter(user=bob, team=teams["robotics"]).exists()


def test_a_utf16_spec_under_the_limit_is_refused_with_its_true_size(bob, demo_registered, settings):
    """The cap is on the UTF-8 text: a CJK-heavy UTF-16 file under it was refused "is N bytes" with N,
    its UTF-8 size, larger than the file (review31)."""
    import codecs

    from tests.conftest import api_client

    settings.SPEC_MAX_BYTES = 400
    text = "task_name: t\n# " + "\u6570\u636e" * 75 + "\n"  # 2 bytes a character in UTF-16, 3 in UTF-8
    body = codecs.BOM_UTF16_LE + text.encode("utf-16-le")
    utf8 = len(text.encode())
    assert len(body) <= 400 < utf8
    response = api_client(bob).post("/api/v1/jobs/", body, content_type="application/yaml")
    assert response.status_code == 400
    assert response.json()["spec"] == [
        f"is {utf8} bytes as UTF-8 (the file sent is {len(body)} bytes in its own "
        "encoding); the limit is 400 bytes of UTF-8"
    ]


def test_a_dataset_edited_while_it_was_deleted_is_said_not_a_500(superuser, teams, demo_registered):
    """A save of the changed columns only (update_fields) of a row deleted between the POST's read and
    the save raised Django's "Save with update_fields did not affect any rows.", a 500 (review32)."""
    from apps.datasets.models import Dataset

    dataset = Dataset.objects.get(team=teams["vision"], name="demo")
    client = admin_client(superuser)
    client.raise_request_exception = False
    url = f"/admin/datasets/dataset/{dataset.pk}/change/"
    data = form_data(client, url) | {"description": "belt camera, 2026"}
    with written_after_the_read(Dataset, lambda pk: Dataset.objects.filter(pk=pk).delete()) as done:
        response = client.post(url, data)
    assert done
    assert response.status_code == 302 and response["Location"] == url
    assert f"nothing saved: dataset “{dataset}” was deleted meanwhile" in said(response)


@pytest.mark.parametrize("edit", [{"task_name": "renamed"}, {"gpus": "2"}])
def test_a_job_edited_while_it_was_deleted_is_said_not_a_500(superuser, bob, teams, edit):
    """The same for a job (its resources' path reads the row locked: the job gone was said "is gone now
    (the scheduler placed it meanwhile)")."""
    job = make_job(team=teams["vision"], user=bob, task_name="q", gpus=1)
    client = admin_client(superuser)
    client.raise_request_exception = False
    url = f"/admin/jobs/job/{job.pk}/change/"
    data = form_data(client, url) | edit
    with written_after_the_read(Job, lambda pk: Job.objects.filter(pk=pk).delete()) as done:
        response = client.post(url, data)
    assert done
    assert response.status_code == 302 and response["Location"] == url
    name = edit.get("task_name", "q")  # the row as the form left it: the name typed
    assert f"nothing saved: job “{name} ({job.pk})” was deleted meanwhile" in said(response)


def test_a_queued_job_placed_between_its_page_and_the_save_says_its_resources_were_not_changed(superuser, bob, teams):
    """The page (GET) offered gpus on a queued job; the scheduler placed it before the POST, which then
    read it starting: gpus read-only, the posted 2 dropped in silence, "was changed successfully"
    (review32). The window is the admin's think time, not the request's."""
    job = make_job(team=teams["vision"], user=bob, task_name="q", gpus=1)
    client = admin_client(superuser)
    url = f"/admin/jobs/job/{job.pk}/change/"
    data = form_data(client, url) | {"gpus": "2", "task_name": "renamed"}
    Job.objects.filter(pk=job.pk).update(state=JobState.STARTING)
    response = client.post(url, data)
    assert response.status_code == 302 and response["Location"] == url
    assert (
        "gpus not changed: job q is starting now (the scheduler placed it meanwhile); resources change only "
        "while it is queued"
    ) in said(response)
    job.refresh_from_db()
    assert (job.gpus, job.task_name) == (1, "q")
    # The same values posted back (nothing asked of the resources) save the rest as before.
    data = form_data(client, url) | {"task_name": "renamed"}
    data["gpus"] = "1"
    assert client.post(url, data).status_code == 302
    job.refresh_from_db()
    assert (job.gpus, job.task_name) == (1, "renamed")
