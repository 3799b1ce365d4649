"""The live scheduler's inputs: what the database says becomes the policy's ClusterState."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from apps.jobs.models import Job, JobState, MetricPoint
from apps.jobs.services import job_submit
from apps.jobs.spec import parse_spec
from apps.quotas.models import TeamQuota, UsageRecord
from apps.scheduling.inputs import cluster_state
from apps.scheduling.policy import DEFAULT_RUNTIME_S

pytestmark = pytest.mark.django_db


def submit(user, epochs: int = 3, **extra):
    document = {"task_name": f"t{epochs}", "command": f"yolo train data=demo model=yolov8n.yaml epochs={epochs}",
                "timeout": 7200, "allow_duplicate": True, **extra}
    job, _ = job_submit(user=user, spec=parse_spec(document))
    return job


def finish(job, *, runtime_s: float, ended_ago_s: float = 60.0, run_class: str = "medium"):
    end = timezone.now() - timedelta(seconds=ended_ago_s)
    Job.objects.filter(pk=job.pk).update(state=JobState.SUCCEEDED, started_at=end - timedelta(seconds=runtime_s),
                                         finished_at=end)
    UsageRecord.objects.create(job=job, team=job.team, user=job.user, attempt=1, priority_class=run_class,
                               gpu_seconds=runtime_s * job.gpus, started_at=end - timedelta(seconds=runtime_s),
                               ended_at=end)


def test_it_estimates_runtimes_from_finished_jobs_scaled_by_what_differs(alice, demo_registered, node):
    """Not an exact-signature match: a 30-epoch job learns from 3-epoch ones, about 10x as long."""
    for runtime in (100.0, 300.0, 200.0):
        finish(submit(alice), runtime_s=runtime)
    same, longer = submit(alice), submit(alice, epochs=30)
    state, _ = cluster_state()
    walltimes = {j.job_id: j.walltime_s for j in state.queued}
    assert walltimes[str(same.pk)] == pytest.approx((100 * 200 * 300) ** (1 / 3), rel=0.1)
    assert walltimes[str(longer.pk)] == pytest.approx(10 * walltimes[str(same.pk)], rel=0.3)
    assert state.runtime_sigma is not None


def test_without_history_a_job_runs_for_its_expected_duration_or_the_default_never_its_timeout(
    alice, demo_registered, node
):
    given, plain = submit(alice, expected_duration=900), submit(alice, epochs=4)
    state, _ = cluster_state()
    jobs = {j.job_id: j for j in state.queued}
    assert jobs[str(given.pk)].walltime == 900
    assert jobs[str(plain.pk)].walltime_s is None
    assert jobs[str(plain.pk)].walltime == DEFAULT_RUNTIME_S < 7200  # the timeout is 7200


def as_val(job):
    Job.objects.filter(pk=job.pk).update(spec={**job.spec, "mode": "val"})
    job.refresh_from_db()
    return job


def test_a_val_job_is_estimated_from_finished_val_jobs_not_from_the_training_model(alice, demo_registered, node):
    """Modes without epochs (val, predict, export) take the median of their own mode's runtimes."""
    for runtime in (1000.0, 3000.0, 2000.0):
        finish(submit(alice, epochs=3), runtime_s=runtime)  # training: ~2,000 s for 3 epochs
    for runtime in (40.0, 60.0, 50.0):
        finish(as_val(submit(alice, epochs=3)), runtime_s=runtime)
    val, train = as_val(submit(alice, epochs=3)), submit(alice, epochs=3)
    state, _ = cluster_state()
    walltimes = {j.job_id: j.walltime_s for j in state.queued}
    assert walltimes[str(val.pk)] == 50.0
    assert walltimes[str(train.pk)] == pytest.approx((1000 * 2000 * 3000) ** (1 / 3), rel=0.1)  # no val jobs in it


def test_a_val_predict_or_export_job_without_history_gets_its_modes_default_not_the_training_hour(
        alice, demo_registered, node):
    """On a new installation six such jobs behind a training were told "start in 15.3 h" and all
    finished within 40 s (new-user trial 23): the hour is a training's default."""
    from apps.scheduling.estimates import MODE_DEFAULT_RUNTIME_S

    jobs = {}
    for mode in ("val", "predict", "export"):
        job = submit(alice, epochs=3)
        Job.objects.filter(pk=job.pk).update(spec={**job.spec, "mode": mode})
        jobs[mode] = job
    state, _ = cluster_state()
    walltimes = {j.job_id: j.walltime for j in state.queued}
    for mode, job in jobs.items():
        assert walltimes[str(job.pk)] == MODE_DEFAULT_RUNTIME_S[mode] < DEFAULT_RUNTIME_S / 10


def test_a_running_job_ends_at_its_own_epoch_rate(alice, demo_registered, node):
    """Started 100 s ago, 2 of 10 epochs done at 40 s each: expected to end in 8 × 40 s."""
    job = submit(alice, epochs=10)
    now = timezone.now()
    Job.objects.filter(pk=job.pk).update(
        state=JobState.RUNNING, node=node, gpu_indices=[0], started_at=now - timedelta(seconds=100), epochs_done=2
    )
    for epoch in (1, 2):
        point = MetricPoint.objects.create(job=job, epoch=epoch, attempt=1, seq=epoch, values={})
        MetricPoint.objects.filter(pk=point.pk).update(created_at=now - timedelta(seconds=100 - 40 * epoch))
    state, _ = cluster_state(now)
    (running,) = state.running
    assert running.expected_end - now.timestamp() == pytest.approx(8 * 40, abs=1)
    assert running.estimated


def test_it_feeds_decayed_usage_the_rolling_day_and_urgent_use(alice, bob, demo_registered, node):
    finish(submit(alice), runtime_s=3600, ended_ago_s=60, run_class="urgent")
    finish(submit(bob, epochs=4), runtime_s=3600, ended_ago_s=2 * 86400)
    state, _ = cluster_state()
    assert state.user_usage_24h["alice"] == pytest.approx(3600, rel=0.01)
    assert state.user_usage_24h.get("bob", 0.0) == 0.0
    assert state.team_urgent_usage_24h["vision"] == pytest.approx(3600, rel=0.01)
    # Two days at a 7-day half-life: bob's usage is worth 2 ** (-2/7) of what it was.
    assert state.usage[("vision", "bob")] == pytest.approx(3600 * 2 ** (-2 / 7), rel=0.02)
    assert state.usage[("vision", "alice")] > state.usage[("vision", "bob")]


def test_usage_is_decayed_from_the_start_of_its_utc_hour(alice, demo_registered, node):
    """The ledger is summed per UTC hour in the database (inputs.EpochHour) and each hour's
    sum decayed from the hour's start: a record ending on the hour and one a millisecond
    before the next hour fall in the same bucket; one on the next hour in the next. (SQLite
    reads stored times to the millisecond: 07:59:59.9996 would count as 08:00.)"""
    from apps.scheduling.inputs import usage_inputs
    from apps.scheduling.models import SchedulerConfig

    job = submit(alice)
    now = datetime(2026, 12, 2, 12, 30, tzinfo=UTC)
    ends = [datetime(2026, 12, 1, 7, 0, tzinfo=UTC), datetime(2026, 12, 1, 7, 59, 59, 999000, tzinfo=UTC),
            datetime(2026, 12, 1, 8, 0, tzinfo=UTC)]
    for attempt, end in enumerate(ends, start=1):
        UsageRecord.objects.create(job=job, team=job.team, user=job.user, attempt=attempt, priority_class="medium",
                                   gpu_seconds=1000.0, started_at=end - timedelta(seconds=10), ended_at=end)
    config = SchedulerConfig.current().to_policy()
    decayed, *_ = usage_inputs(config, [], now)

    def worth(hour_start: datetime) -> float:
        return 1000.0 * 2 ** (-(now - hour_start).total_seconds() / config.half_life_s)

    expected = 2 * worth(datetime(2026, 12, 1, 7, tzinfo=UTC)) + worth(datetime(2026, 12, 1, 8, tzinfo=UTC))
    assert decayed[("vision", "alice")] == pytest.approx(expected, rel=1e-9)


def test_team_quota_rows_become_team_policies(alice, demo_registered, node, teams):
    TeamQuota.objects.create(team=teams["vision"], max_gpus=3, urgent_max_gpus=1)
    state, _ = cluster_state()
    assert state.teams["vision"].max_gpus == 3 and state.teams["vision"].urgent_max_gpus == 1
    assert state.teams["robotics"].max_gpus is None
    assert state.config.policy == "fair"


def test_a_job_over_the_teams_gpu_limit_is_rejected_at_submit(alice, demo_registered, node, teams):
    from apps.jobs.spec import SpecError

    TeamQuota.objects.create(team=teams["vision"], max_gpus_per_job=1)
    with pytest.raises(SpecError) as error:
        submit(alice, resources={"gpu": 2})
    assert "per-job limit is 1" in error.value.errors["resources.gpu"]


def test_a_second_planning_pass_rewrites_no_unchanged_queue_row(alice, demo_registered, node):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from apps.scheduling.loop import plan_and_start

    waiting = [submit(alice, epochs=e, resources={"gpu": 2}) for e in (5, 6, 7)]  # node-a has 2 GPUs
    plan_and_start()
    queued = Job.objects.filter(state=JobState.QUEUED)
    assert queued.count() == 2 and all(j.reason and j.queue_position for j in queued)
    with CaptureQueriesContext(connection) as queries:
        plan_and_start()
    updates = [q["sql"] for q in queries.captured_queries if 'UPDATE "jobs_job"' in q["sql"]]
    assert updates == [], updates
    assert len(waiting) == 3


def test_a_user_over_the_daily_quota_is_told_their_job_runs_only_on_idle_gpus(alice, bob, demo_registered, node):
    """alice has used 21 of 20 GPU-hours today; bob's jobs hold both GPUs: alice's job waits as over-quota work."""
    from apps.scheduling.loop import plan_and_start

    finish(submit(alice), runtime_s=21 * 3600, ended_ago_s=600)
    busy = [submit(bob, epochs=e) for e in (5, 6)]
    plan_and_start()
    assert all(Job.objects.get(pk=j.pk).state == JobState.STARTING for j in busy)
    waiting = submit(alice, epochs=7)
    plan_and_start()
    waiting.refresh_from_db()
    assert waiting.state == JobState.QUEUED
    assert waiting.reason.startswith("over quota: runs when GPUs are idle, may be preempted")


def test_a_queued_jobs_eta_range_reaches_the_api_the_queue_and_the_job_page(alice, bob, demo_registered, node):
    """A real planning pass gives the waiting job a point ETA inside a P10-P90 range; the job
    API, queue/ and the portal's job page show that range (the CLI's rendering is tested in
    tests/cli against a live server)."""
    from django.test import Client
    from django.utils.dateparse import parse_datetime

    from apps.scheduling.loop import plan_and_start
    from tests.conftest import api_client

    busy = [submit(bob, epochs=e) for e in (5, 6)]
    plan_and_start()
    assert all(Job.objects.get(pk=j.pk).state == JobState.STARTING for j in busy)
    waiting = submit(alice, epochs=7)
    plan_and_start()
    waiting.refresh_from_db()
    low, eta, high = waiting.estimated_start_low_at, waiting.estimated_start_at, waiting.estimated_start_high_at
    assert waiting.state == JobState.QUEUED and None not in (low, eta, high)
    assert timezone.now() - timedelta(seconds=5) <= low <= eta <= high and low < high

    shown = api_client(alice).get(f"/api/v1/jobs/{waiting.pk}/").json()
    assert [parse_datetime(shown[f]) for f in ("estimated_start_low_at", "estimated_start_at",
                                               "estimated_start_high_at")] == [low, eta, high]
    entry = next(e for e in api_client(alice).get("/api/v1/queue/").json()["results"] if e["id"] == str(waiting.pk))
    assert parse_datetime(entry["estimated_start_low_at"]) == low
    assert parse_datetime(entry["estimated_start_high_at"]) == high

    client = Client()
    client.force_login(alice)
    page = client.get(f"/jobs/{waiting.pk}/").content.decode()
    assert "Likely between" in page
    for moment in (low, high):
        assert f'data-time="{timezone.localtime(moment).isoformat()}"' in page
    listing = client.get("/jobs/").content.decode()
    assert "(up to " in listing


def test_the_urgent_allowance_is_charged_by_the_class_a_job_ran_as(alice, demo_registered, node):
    """An urgent job that ran as high (beyond the allowance) uses none of the urgent allowance."""
    from apps.quotas.services import usage_charge

    for run_class, hours in (("urgent", 1.0), ("high", 5.0)):
        job = submit(alice, priority="urgent")
        start = timezone.now() - timedelta(hours=hours, minutes=1)
        Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING, node=node, run_class=run_class, started_at=start)
        job.refresh_from_db()
        usage_charge(job, ended_at=start + timedelta(hours=hours))
        Job.objects.filter(pk=job.pk).update(state=JobState.SUCCEEDED)
    state, _ = cluster_state()
    assert state.team_urgent_usage_24h["vision"] == pytest.approx(3600, rel=0.01)


def test_the_eta_track_record_is_each_started_jobs_first_eta_against_its_first_start(alice, demo_registered, node,
                                                                                     monkeypatch):
    """(predicted wait, actual wait) from the model's first point and first_started_at, oldest first:
    only jobs that waited with an ETA, at most HISTORY_MAX_WAIT_S, and first started within HISTORY_S;
    queued ones are not in it. A row from before predicted_model_start_at existed counts with its
    predicted_start_at. The waits are computed by the database (to the second here); a wait too
    long is left out before the newest HISTORY_N are taken (2 here: it started last), as in the simulator."""
    from apps.scheduling import inputs
    from apps.scheduling.policy.eta_calibration import HISTORY_MAX_WAIT_S, HISTORY_S

    monkeypatch.setattr(inputs, "HISTORY_N", 2)

    now = timezone.now()

    def job_at(created_ago_h, predicted_after_h, started_after_h, model_after_h=None):
        job = submit(alice)
        created = now - timedelta(hours=created_ago_h)
        Job.objects.filter(pk=job.pk).update(
            created_at=created,
            predicted_start_at=None if predicted_after_h is None else created + timedelta(hours=predicted_after_h),
            predicted_model_start_at=None if model_after_h is None else created + timedelta(hours=model_after_h),
            first_started_at=None if started_after_h is None else created + timedelta(hours=started_after_h),
        )

    job_at(5, 0.75, 1, model_after_h=0.5)  # waited 1 h; the model said 30 min (shown: 45 min, calibrated)
    job_at(3, 2, 1.5)  # waited 1.5 h, told 2 h (an older row: no model point): started after the first
    job_at(HISTORY_S / 3600 + 3, 1, 2)  # started an hour before the window: out of it
    job_at(HISTORY_MAX_WAIT_S / 3600 + 2, 1, HISTORY_MAX_WAIT_S / 3600 + 1)  # started an hour ago after waiting too long
    job_at(2, None, 0)  # started in its first pass: never given an ETA
    job_at(1, 3, None)  # still waiting: its outcome is not known yet
    state, _ = cluster_state(now)
    assert [(round(p), round(a)) for p, a in state.eta_history] == [(1800, 3600), (7200, 5400)]


def test_the_starving_preemption_window_is_an_admin_setting_in_hours():
    """Off (None) unless an admin sets it; hours in admin, seconds in the policy; never negative."""
    from django.core.exceptions import ValidationError

    from apps.scheduling.models import SchedulerConfig

    assert cluster_state()[0].config.starving_preempt_window_s is None
    config = SchedulerConfig.current()
    config.size_preemption, config.starving_preempt_window_hours = True, 6
    config.full_clean()
    config.save()
    policy = cluster_state()[0].config
    assert policy.size_preemption and policy.starving_preempt_window_s == 6 * 3600
    config.starving_preempt_window_hours = -1
    with pytest.raises(ValidationError) as refused:
        config.full_clean()
    assert "starving_preempt_window_hours" in refused.value.message_dict


def test_size_forgiveness_and_requeued_whole_node_first_are_admin_settings_off_by_default():
    """The three settings of issue 14's candidate sfwrq (docs/scheduling.md): off as PolicyConfig's
    defaults; hours in admin, seconds in the policy; a zero or negative duration and a negative
    GPU count are refused at their own fields, in the form's words."""
    from django.core.exceptions import ValidationError

    from apps.scheduling.models import SchedulerConfig
    from apps.scheduling.policy import PolicyConfig

    policy = cluster_state()[0].config
    shipped = PolicyConfig()
    assert policy.size_forgiveness_s is None is shipped.size_forgiveness_s
    assert policy.size_forgiveness_min_gpus == shipped.size_forgiveness_min_gpus == 0
    assert policy.requeued_whole_node_first is shipped.requeued_whole_node_first is False
    config = SchedulerConfig.current()
    config.size_preemption, config.starving_preempt_window_hours = True, 6
    config.size_forgiveness_hours, config.size_forgiveness_min_gpus, config.requeued_whole_node_first = 168, 8, True
    config.full_clean()
    config.save()
    policy = cluster_state()[0].config
    assert policy.size_forgiveness_s == 7 * 86400 and policy.size_forgiveness_min_gpus == 8
    assert policy.requeued_whole_node_first and policy.size_preemption
    assert policy.starving_preempt_window_s == 6 * 3600
    for field, value in [("size_forgiveness_hours", 0), ("size_forgiveness_hours", -1),
                         ("size_forgiveness_min_gpus", -1)]:
        config.refresh_from_db()
        setattr(config, field, value)
        with pytest.raises(ValidationError) as refused:
            config.full_clean()
        assert list(refused.value.message_dict) == [field], refused.value.message_dict


def test_a_live_pass_ranks_a_long_waiting_8_gpu_job_by_its_forgiven_size(alice, demo_registered):
    """A real planning pass (database in, queue rows out): two of alice's jobs wait behind a busy
    8-GPU node, both past the age cap. Off, the 4-GPU job ranks first (smaller); with size
    forgiveness for jobs of 8 GPUs or more, the 8-GPU job's size factor is 1 and it ranks first."""
    from apps.scheduling.loop import plan_and_start
    from apps.scheduling.models import SchedulerConfig
    from worker.inventory import simulated_gpus
    from worker.node import register_this_host

    register_this_host(name="node-8", gpus=simulated_gpus(8))
    config = SchedulerConfig.current()
    config.age_cap_hours = 1
    config.save()
    busy = submit(alice, epochs=9, resources={"gpu": 8})
    plan_and_start()
    assert Job.objects.get(pk=busy.pk).state == JobState.STARTING
    whole, half = submit(alice, epochs=5, resources={"gpu": 8}), submit(alice, epochs=5, resources={"gpu": 4})
    Job.objects.filter(pk__in=[whole.pk, half.pk]).update(created_at=timezone.now() - timedelta(hours=3))

    def ranked():
        plan_and_start()
        rows = {j.pk: j for j in Job.objects.filter(pk__in=[whole.pk, half.pk])}
        assert all(j.state == JobState.QUEUED for j in rows.values())
        return rows[whole.pk], rows[half.pk]

    w, h = ranked()
    assert w.priority_factors["size"] < h.priority_factors["size"] < 1
    assert h.queue_position < w.queue_position
    config.size_forgiveness_hours, config.size_forgiveness_min_gpus = 1, 8  # waited 3 h: cap 1 h + 1 h passed
    config.save()
    w, h = ranked()
    assert w.priority_factors["size"] == 1 and h.priority_factors["size"] < 1
    assert w.queue_position < h.queue_position
    assert w.priority_score > h.priority_score


def test_the_runtime_model_is_fitted_again_only_when_a_job_has_succeeded(alice, demo_registered, node):
    """Every pass asks for the model; between successes it is the one already fitted (two
    index seeks tell), and any new success is in the next fit, even one that finished
    before the newest (its usage record is new)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from apps.scheduling.estimates import fit_runtime_model

    for epochs in (3, 5, 8, 13, 21, 34):
        finish(submit(alice, epochs=epochs), runtime_s=10.0 * epochs)
    first = fit_runtime_model()
    with CaptureQueriesContext(connection) as queries:
        assert fit_runtime_model() is first
    assert len(queries.captured_queries) == 2
    finish(submit(alice, epochs=55), runtime_s=550.0, ended_ago_s=7200.0)
    refit = fit_runtime_model()
    assert refit is not first and refit.samples == first.samples + 1
