"""Admin's node drain asks why and shows it to the users who wait; "drain and requeue" takes the
running jobs off through the preemption path; what the worker reports is read-only (trial 14, F6)."""

from __future__ import annotations

import pytest

from apps.accounts.models import AuditEntry
from apps.cluster.models import GPU, Node
from apps.jobs.models import Job, JobEvent, JobState
from apps.jobs.services import attempt_start, job_claim, job_submit
from apps.jobs.spec import parse_spec
from apps.quotas.models import UsageRecord
from apps.scheduling.loop import plan_and_start
from apps.scheduling.models import SchedulerConfig
from tests.conftest import admin_client, api_client
from tests.jobs.factories import make_job

pytestmark = pytest.mark.django_db


def drain(client, node, *, action="drain", **extra):
    return client.post("/admin/cluster/node/", {"action": action, "_selected_action": [str(node.pk)], **extra},
                       follow=True)


def running_on(node, *, team, user, task_name):
    job = make_job(team=team, user=user, task_name=task_name)
    assert job_claim(job, node=node, gpu_indices=[0], gpu_share=0.5, run_class="medium")
    return attempt_start(job_id=job.pk, attempt_id=job.attempt_id, node_name=node.name)


def test_drain_asks_why_and_changes_nothing_until_told(superuser, node):
    client = admin_client(superuser)
    page = drain(client, node).content.decode()
    assert 'name="reason"' in page and 'name="apply"' in page
    assert Node.objects.get(pk=node.pk).state == Node.State.ACTIVE

    page = drain(client, node, apply="yes", reason="  ").content.decode()
    assert "This field is required" in page
    assert Node.objects.get(pk=node.pk).state == Node.State.ACTIVE
    assert not AuditEntry.objects.filter(action="admin.action").exists()


def test_the_drain_reason_is_recorded_audited_and_shown_where_the_drain_is_explained(superuser, bob, node,
                                                                                      demo_registered):
    client = admin_client(superuser)
    page = drain(client, node, apply="yes", reason="GPU swap at 15:00").content.decode()
    assert "1 node(s) draining" in page and "reason: GPU swap at 15:00" in page
    node.refresh_from_db()
    assert (node.state, node.drain_reason) == (Node.State.DRAINING, "GPU swap at 15:00")
    (entry,) = AuditEntry.objects.filter(action="admin.action", target_type="node")
    assert entry.data["changes"]["drain_reason"] == {"from": "", "to": "GPU swap at 15:00"}

    document = {"task_name": "waits", "command": "yolo train data=demo model=yolov8n.yaml epochs=3",
                "resources": {"gpu": 1}, "timeout": 3600}
    job, _ = job_submit(user=bob, spec=parse_spec(document))
    plan_and_start()
    reason = next(e["reason"] for e in api_client(bob).get("/api/v1/queue/").json()["results"]
                  if e["id"] == str(job.pk))
    assert "node-a (draining: GPU swap at 15:00)" in reason
    (shown,) = api_client(bob).get("/api/v1/cluster/").json()["nodes"]
    assert shown["drain_reason"] == "GPU swap at 15:00"
    assert "GPU swap at 15:00" in admin_client(bob).get("/").content.decode()

    drain(client, node, action="resume")
    node.refresh_from_db()
    assert (node.state, node.drain_reason) == (Node.State.ACTIVE, "")


def test_drain_and_requeue_takes_running_jobs_off_like_a_preemption(superuser, manager, bob, teams, node):
    first = running_on(node, team=teams["vision"], user=bob, task_name="first")
    second = running_on(node, team=teams["vision"], user=manager, task_name="second")
    config = SchedulerConfig.current()
    config.preempt_grace_s = 120
    config.save()
    drain(admin_client(manager), node, action="evacuate", apply="yes", reason="mine now")  # managers only look
    assert Job.objects.get(pk=first.pk).state == JobState.RUNNING
    client = admin_client(superuser)
    page = drain(client, node, action="evacuate").content.decode()
    assert "first" in page and "second" in page  # the jobs it will requeue are listed before
    assert Job.objects.get(pk=first.pk).state == JobState.RUNNING

    page = drain(client, node, action="evacuate", apply="yes", reason="fan failure").content.decode()
    assert "2 job(s) requeued" in page
    assert Node.objects.get(pk=node.pk).state == Node.State.DRAINING
    for job in (first, second):
        after = Job.objects.get(pk=job.pk)
        assert (after.state, after.attempt, after.node_id) == (JobState.QUEUED, 2, None)
        event = JobEvent.objects.filter(job=job, kind="preempted").get()
        assert "node node-a is drained by root (fan failure); resumes from its checkpoint" in event.message
        # the preemption path: the old attempt stops at its epoch end within the configured grace
        assert event.data["attempt_id"] == str(job.attempt_id) and event.data["grace_s"] == 120
        assert UsageRecord.objects.filter(job=job, attempt=1).exists()  # its GPU time so far is charged
    requeues = AuditEntry.objects.filter(action=AuditEntry.Action.JOB_REQUEUE, actor=superuser)
    assert sorted(e.target_id for e in requeues) == sorted([str(first.pk), str(second.pk)])


def test_an_operators_drain_reason_reaches_the_timeline_as_typed(superuser, manager, bob, teams, node):
    """A reason with markup and a wiki path is neither cut as a server path nor rendered as HTML (optrial24, F5)."""
    job = running_on(node, team=teams["vision"], user=bob, task_name="first")
    reason = "NVLink swap <b>x</b>, see /wiki/maint-42"
    drain(admin_client(superuser), node, action="evacuate", apply="yes", reason=reason)

    said = f"node node-a is drained by root ({reason}); resumes from its checkpoint"
    assert said in JobEvent.objects.get(job=job, kind="preempted").message
    (event,) = [e for e in api_client(bob).get(f"/api/v1/jobs/{job.pk}/events/").json()["results"]
                if e["kind"] == "preempted"]
    assert said in event["message"]
    page = admin_client(manager).get(f"/admin/jobs/job/{job.pk}/change/").content.decode()
    assert "NVLink swap &lt;b&gt;x&lt;/b&gt;, see /wiki/maint-42" in page and "<b>x</b>" not in page


def test_what_the_worker_reports_is_read_only_in_the_change_form(superuser, node):
    client = admin_client(superuser)
    url = f"/admin/cluster/node/{node.pk}/change/"
    form = client.get(url).content.decode()
    for field in ("state", "worker_pid", "last_heartbeat", "cpu_count", "memory_mb", "hostname", "drain_reason"):
        assert f'name="{field}"' not in form, field
    assert 'name="gpus-0-memory_mb"' not in form and 'name="gpus-0-DELETE"' not in form
    before = Node.objects.get(pk=node.pk)
    client.post(url, {"state": "lost", "worker_pid": "1", "cpu_count": "999", "hostname": "x",
                      "gpus-TOTAL_FORMS": "0", "gpus-INITIAL_FORMS": "2"})
    after = Node.objects.get(pk=node.pk)
    assert (after.state, after.worker_pid, after.cpu_count, after.hostname) == (
        before.state, before.worker_pid, before.cpu_count, before.hostname)
    assert GPU.objects.filter(node=node).count() == 2
    assert client.get("/admin/cluster/node/add/").status_code == 403
    gpu = GPU.objects.filter(node=node).first()
    assert 'name="memory_mb"' not in client.get(f"/admin/cluster/gpu/{gpu.pk}/change/").content.decode()
