"""yoloq for a manager against a live server: requeue, and queue filtered by team, user and state
(manager trial F23)."""

from __future__ import annotations

import pytest
from django.utils import timezone

from apps.accounts.services import token_create
from apps.jobs.models import Job, JobState
from cli import yoloq
from tests.jobs.factories import make_job

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def login(web, user, capsys) -> None:
    _, key = token_create(user=user, name="cli")
    assert yoloq.main(["login", web.url, "--token", key]) == 0
    capsys.readouterr()


def run(capsys, *argv) -> tuple[int, str, str]:
    code = yoloq.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_manager_requeues_a_running_job_and_a_member_is_told_why_not(web, config, alice, bob, teams, capsys):
    job = make_job(team=teams["vision"], user=bob, task_name="bob-long", state=JobState.RUNNING,
                   started_at=timezone.now())
    login(web, bob, capsys)
    code, _, err = run(capsys, "requeue", str(job.pk)[:8])
    assert code == 1 and "only a manager of the job's team may requeue it" in err
    login(web, alice, capsys)
    code, out, _ = run(capsys, "requeue", str(job.pk)[:8])
    assert code == 0 and f"Requeued {job.pk} (bob-long): it resumes from its checkpoint as attempt 2." in out
    assert Job.objects.get(pk=job.pk).state == JobState.QUEUED
    code, _, err = run(capsys, "requeue", str(job.pk)[:8])
    assert code == 1 and "state: job is queued; only starting or running jobs can be requeued" in err


def test_a_manager_changes_a_queued_jobs_class_and_a_member_is_told_why_not(web, config, alice, bob, teams, capsys):
    job = make_job(team=teams["vision"], user=bob, task_name="bob-waits")
    login(web, bob, capsys)
    code, _, err = run(capsys, "class", str(job.pk)[:8], "high")
    assert code == 1 and "only a manager of the job's team may change its class" in err
    login(web, alice, capsys)
    code, _, err = run(capsys, "class", str(job.pk)[:8], "critical")
    assert code == 1 and "priority: must be one of low, medium, high, urgent, got 'critical'" in err
    code, out, _ = run(capsys, "class", str(job.pk)[:8], "high")
    assert code == 0 and f"{job.pk} (bob-waits): class medium → high." in out
    assert Job.objects.get(pk=job.pk).priority_class == "high"
    code, out, _ = run(capsys, "class", str(job.pk)[:8], "high")
    assert code == 0 and "is already high; nothing changed." in out
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING)
    code, _, err = run(capsys, "class", str(job.pk)[:8], "low")  # named as requeue names it (CI trial 17, H12)
    assert code == 1 and "state: the job is running; only a queued job changes class" in err


def test_queue_filters_by_team_user_and_state(web, config, alice, bob, carol, teams, capsys):
    make_job(team=teams["vision"], user=bob, task_name="bob-waits", queue_position=1)
    make_job(team=teams["vision"], user=alice, task_name="alice-waits", queue_position=2)
    make_job(team=teams["vision"], user=bob, task_name="bob-done", state=JobState.SUCCEEDED,
             finished_at=timezone.now())
    login(web, alice, capsys)
    code, out, _ = run(capsys, "queue", "--user", "bob")
    assert code == 0 and "bob-waits" in out and "alice-waits" not in out and "bob-done" not in out
    code, out, _ = run(capsys, "queue", "--team", "vision", "--state", "succeeded")
    assert code == 0 and "bob-done" in out and "ended" in out and "bob-waits" not in out
    code, out, _ = run(capsys, "queue", "--state", "running")
    assert code == 0 and "No running jobs." in out
    code, _, err = run(capsys, "queue", "--user", "carol")
    assert code == 1 and "user: no member of your teams is named 'carol'" in err
    code, _, err = run(capsys, "queue", "--team", "robotics")
    assert code == 1 and "team: you are not a member of a team named 'robotics'" in err


def test_queue_takes_the_portals_active_and_finished(web, config, alice, bob, teams, capsys):
    """--state finished lists every ended job, --state active what runs and waits (manager trial 15, F10)."""
    make_job(team=teams["vision"], user=bob, task_name="bob-waits", queue_position=1)
    make_job(team=teams["vision"], user=bob, task_name="bob-done", state=JobState.SUCCEEDED, finished_at=timezone.now())
    make_job(team=teams["vision"], user=bob, task_name="bob-broke", state=JobState.FAILED, finished_at=timezone.now())
    login(web, alice, capsys)
    code, out, _ = run(capsys, "queue", "--state", "finished")
    assert code == 0 and "bob-done" in out and "bob-broke" in out and "ended" in out and "bob-waits" not in out
    code, out, _ = run(capsys, "queue", "--state", "active")
    assert code == 0 and "bob-waits" in out and "bob-done" not in out
    with pytest.raises(SystemExit):
        yoloq.main(["queue", "-h"])
    assert "finished: every ended state" in capsys.readouterr().out


def test_queue_says_when_the_scheduler_is_not_planning(web, config, alice, teams, capsys):
    """Multi-node trial M9: with the scheduler stopped the queue kept its stale estimates silently."""
    from apps.monitoring import recorders

    make_job(team=teams["vision"], user=alice, task_name="alice-waits", queue_position=1)
    login(web, alice, capsys)
    recorders.scheduler_pass_record(0.01, finished_at=timezone.now().timestamp() - 600)
    code, out, err = run(capsys, "queue")
    assert code == 0 and "alice-waits" in out
    assert "note: the scheduler has not planned since" in err and "(10 min ago)" in err
    recorders.scheduler_pass_record(0.01)
    code, _, err = run(capsys, "queue")
    assert code == 0 and "note:" not in err


def test_status_of_a_queued_job_says_when_the_scheduler_is_not_planning(web, config, alice, teams, capsys):
    """fault32: with the scheduler killed, `yoloq status` of a queued job said "estimated start: any
    moment" and the dead scheduler's last reason; only `yoloq queue` and the job page said it had stopped."""
    from apps.monitoring import recorders

    waiting = make_job(team=teams["vision"], user=alice, task_name="alice-waits", queue_position=1)
    login(web, alice, capsys)
    recorders.scheduler_pass_record(0.01, finished_at=timezone.now().timestamp() - 600)
    code, out, err = run(capsys, "status", str(waiting.pk)[:8])
    assert code == 0 and "alice-waits" in out
    assert "note: the scheduler has not planned since" in err and "(10 min ago)" in err
    recorders.scheduler_pass_record(0.01)
    code, _, err = run(capsys, "status", str(waiting.pk)[:8])
    assert code == 0 and "note:" not in err
