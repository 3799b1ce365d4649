"""/metrics: families read from the database and Redis at scrape time, checked by promtool."""

from __future__ import annotations

import sys
import types
from datetime import timedelta

import pytest
from django.test import Client, override_settings
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from apps.jobs.models import JobEvent, MetricPoint
from apps.monitoring import recorders
from apps.monitoring.collector import metric_names
from apps.quotas.models import TeamQuota, UsageRecord
from apps.scheduling.models import SchedulerConfig
from tests.jobs.factories import make_job

from .tools import run

pytestmark = pytest.mark.django_db


SCRAPE_TOKEN = "test-scrape-token"


def scrape(client: Client | None = None, *, as_prometheus: bool = True, **headers) -> tuple[int, str]:
    """GET /metrics as the deployment's Prometheus does (METRICS_TOKEN set, its bearer token), or
    with exactly the settings in force and the ``headers`` given (``as_prometheus=False``)."""
    if as_prometheus and not headers:
        with override_settings(METRICS_TOKEN=SCRAPE_TOKEN):
            response = (client or Client()).get("/metrics", HTTP_AUTHORIZATION=f"Bearer {SCRAPE_TOKEN}")
    else:
        response = (client or Client()).get("/metrics", **headers)
    return response.status_code, response.content.decode()


def samples(text: str) -> dict[tuple[str, tuple], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


def value(text: str, name: str, **labels) -> float:
    return samples(text)[(name, tuple(sorted(labels.items())))]


@pytest.fixture
def busy_cluster(teams, alice, bob, carol, node):
    """Queued, running and finished jobs, a ledger, and metric points of a running job."""
    now = timezone.now()
    vision, robotics = teams["vision"], teams["robotics"]
    for _ in range(2):
        make_job(team=vision, user=bob, priority_class="high")
    make_job(team=robotics, user=carol, priority_class="low", gpus=2)
    running = make_job(team=vision, user=alice, state="running", node=node, gpu_indices=[0], gpu_share=0.5,
                       started_at=now - timedelta(minutes=5), first_started_at=now - timedelta(minutes=5))
    running.created_at = now - timedelta(minutes=20)
    running.save(update_fields=["created_at"])
    MetricPoint.objects.create(job=running, epoch=1, attempt=1, seq=1,
                               values={"train/box_loss": 2.5, "metrics/mAP50-95(B)": 0.1})
    MetricPoint.objects.create(job=running, epoch=2, attempt=1, seq=2,
                               values={"train/box_loss": 1.25, "train/cls_loss": 3.0, "metrics/mAP50(B)": 0.4,
                                       "metrics/mAP50-95(B)": 0.2})
    done = make_job(team=robotics, user=carol, state="failed", finished_at=now)
    UsageRecord.objects.create(job=done, team=robotics, user=carol, attempt=1, priority_class="medium",
                               gpu_seconds=7200.0, started_at=now - timedelta(hours=2), ended_at=now)
    JobEvent.objects.create(job=done, seq=1, attempt=1, kind="failed")
    JobEvent.objects.create(job=running, seq=3, attempt=1, kind="preempted")
    return {"running": running, "done": done}


def test_it_exports_queue_jobs_ledger_and_running_job_metrics(busy_cluster, teams):
    _, text = scrape()
    job = str(busy_cluster["running"].pk)
    assert value(text, "yoloportal_queue_depth", team="vision", **{"class": "high"}) == 2
    assert value(text, "yoloportal_queue_depth", team="robotics", **{"class": "low"}) == 1
    assert value(text, "yoloportal_gpus_requested_queued", **{"class": "low"}) == 2
    assert value(text, "yoloportal_jobs_running", team="vision") == 1
    assert value(text, "yoloportal_jobs_finished_total", outcome="failed") == 1
    assert value(text, "yoloportal_jobs_finished_total", outcome="succeeded") == 0
    assert value(text, "yoloportal_attempts_ended_total", reason="preempted") == 1
    assert value(text, "yoloportal_gpu_seconds_charged_total", team="robotics") == 7200
    assert value(text, "yoloportal_gpu_seconds_charged_total", team="vision") == 0
    # The latest epoch's values, by job id; a running job only.
    assert value(text, "yoloportal_job_epoch", job=job, team="vision") == 2
    assert value(text, "yoloportal_job_loss", job=job, team="vision", loss="box") == 1.25
    assert value(text, "yoloportal_job_map", job=job, team="vision", iou="50-95") == 0.2
    assert value(text, "yoloportal_gpu_allocated_ratio", node="node-a", gpu="0") == 0.5
    assert value(text, "yoloportal_node_up", node="node-a") == 1
    # Waited 15 minutes from submit to start: in the 30-minute bucket, not the 10-minute one.
    assert value(text, "yoloportal_job_wait_seconds_bucket", le="600.0", **{"class": "medium"}) == 0
    assert value(text, "yoloportal_job_wait_seconds_bucket", le="1800.0", **{"class": "medium"}) == 1
    assert value(text, "yoloportal_job_wait_seconds_sum", **{"class": "medium"}) == pytest.approx(900, abs=2)


def test_finished_jobs_drop_out_of_the_per_job_families(busy_cluster):
    running = busy_cluster["running"]
    running.state = "succeeded"
    running.save(update_fields=["state"])
    _, text = scrape()
    assert "yoloportal_job_loss{" not in text and "yoloportal_job_epoch{" not in text


def test_the_quota_in_force_is_exported_per_team(teams):
    SchedulerConfig.current()
    SchedulerConfig.objects.update(user_gpu_hours_per_day=12)
    TeamQuota.objects.create(team=teams["robotics"], user_gpu_hours_per_day=3, max_gpus=4)
    _, text = scrape()
    assert value(text, "yoloportal_user_quota_gpu_seconds_per_day", team="vision") == 12 * 3600
    assert value(text, "yoloportal_user_quota_gpu_seconds_per_day", team="robotics") == 3 * 3600
    assert value(text, "yoloportal_team_max_gpus", team="robotics") == 4


def test_a_team_without_a_limit_keeps_its_series_at_plus_infinity(teams):
    """Operator trial 29: deleting a team's quota removed its `yoloportal_team_max_gpus` series, so
    a rule saw the series absent (a team gone, a broken scrape) where the limit was "none". Every
    team has both quota series; no limit is +Inf, which compares and divides as one: `held >=
    max` never holds, `held / max` is 0 (docs/observability.md)."""
    SchedulerConfig.current()
    SchedulerConfig.objects.update(user_gpu_hours_per_day=None)
    quota = TeamQuota.objects.create(team=teams["robotics"], max_gpus=0, user_gpu_hours_per_day=2)
    _, text = scrape()
    assert value(text, "yoloportal_team_max_gpus", team="robotics") == 0  # none: 0 stays 0
    assert value(text, "yoloportal_team_max_gpus", team="vision") == float("inf")  # no quota row
    assert value(text, "yoloportal_user_quota_gpu_seconds_per_day", team="vision") == float("inf")
    assert 'yoloportal_team_max_gpus{team="vision"} +Inf' in text

    quota.delete()
    _, text = scrape()
    assert value(text, "yoloportal_team_max_gpus", team="robotics") == float("inf")
    assert value(text, "yoloportal_user_quota_gpu_seconds_per_day", team="robotics") == float("inf")


def test_scheduler_and_worker_values_come_from_redis(db):
    recorders.scheduler_pass_record(0.03, finished_at=1_700_000_000.0)
    recorders.scheduler_pass_record(2.0)
    recorders.gpus_freed("node-a", [0, 1], jobs_waiting=True, at=1000.0)
    assert recorders.training_started("node-a", [0], at=1004.0) == 4.0
    assert recorders.training_started("node-a", [0], at=1010.0) is None  # once per freeing
    recorders.gpus_freed("node-a", [1], jobs_waiting=False)
    assert recorders.training_started("node-a", [1]) is None  # nothing waited: no latency
    recorders.websocket_connected("specific.abc")
    _, text = scrape()
    assert value(text, "yoloportal_redis_up") == 1
    assert value(text, "yoloportal_scheduler_pass_duration_seconds_count") == 2
    assert value(text, "yoloportal_scheduler_pass_duration_seconds_bucket", le="0.05") == 1
    assert value(text, "yoloportal_scheduler_pass_duration_seconds_bucket", le="2.5") == 2
    assert value(text, "yoloportal_scheduler_last_pass_timestamp_seconds") > 1_700_000_000
    assert value(text, "yoloportal_dispatch_latency_seconds_count") == 1
    assert value(text, "yoloportal_dispatch_latency_seconds_bucket", le="3.0") == 0
    assert value(text, "yoloportal_dispatch_latency_seconds_bucket", le="5.0") == 1
    assert value(text, "yoloportal_websocket_clients") == 1
    recorders.websocket_disconnected("specific.abc")
    assert value(scrape()[1], "yoloportal_websocket_clients") == 0


def test_redis_down_is_a_metric_not_an_error(db):
    with override_settings(REDIS_URL="redis://127.0.0.1:1/0"):
        status, text = scrape()
    assert status == 200
    assert value(text, "yoloportal_redis_up") == 0
    assert "yoloportal_jobs{" in text


class FakeNvml(types.ModuleType):
    """pynvml's calls as the inventory reader uses them, with readings the test chooses."""

    def __init__(self, devices: list[dict]) -> None:
        super().__init__("pynvml")
        self.devices = devices

    def nvmlInit(self):  # noqa: N802 - pynvml's names
        pass

    def nvmlShutdown(self):  # noqa: N802
        pass

    def nvmlDeviceGetCount(self):  # noqa: N802
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index):  # noqa: N802
        return self.devices[index]

    def nvmlDeviceGetName(self, handle):  # noqa: N802
        return handle["name"].encode()

    def nvmlDeviceGetUUID(self, handle):  # noqa: N802
        return handle["uuid"]

    def nvmlDeviceGetMemoryInfo(self, handle):  # noqa: N802
        return types.SimpleNamespace(total=handle["total"], used=handle["used"])

    def nvmlDeviceGetUtilizationRates(self, handle):  # noqa: N802
        return types.SimpleNamespace(gpu=handle["util"])


def test_gpu_readings_travel_from_the_pynvml_reader_through_the_heartbeat(transactional_db, monkeypatch):
    """The worker's own heartbeat thread reads pynvml (faked at that boundary) into the GPU rows."""
    import time

    from apps.cluster.models import GPU
    from worker.inventory import nvml_gpus
    from worker.node import Heartbeat, register_this_host

    gib = 2**30
    fake = FakeNvml([{"name": "NVIDIA H100", "uuid": "GPU-0", "total": 80 * gib, "used": 20 * gib, "util": 97},
                     {"name": "NVIDIA H100", "uuid": "GPU-1", "total": 80 * gib, "used": 0, "util": 0}])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    node = register_this_host(name="gpu-1", gpus=nvml_gpus())
    fake.devices[1].update(used=40 * gib, util=55)
    beat = Heartbeat(node, 0.05, simulated=False)
    beat.start()
    try:
        deadline = time.monotonic() + 10
        while GPU.objects.get(node=node, index=1).utilization != 55 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        beat.stop()
        beat.join(5)
    _, text = scrape()
    assert value(text, "yoloportal_gpu_utilization_ratio", node="gpu-1", gpu="0") == 0.97
    assert value(text, "yoloportal_gpu_utilization_ratio", node="gpu-1", gpu="1") == 0.55
    assert value(text, "yoloportal_gpu_memory_used_bytes", node="gpu-1", gpu="1") == 40 * gib
    assert value(text, "yoloportal_gpu_memory_total_bytes", node="gpu-1", gpu="0") == 80 * gib
    assert value(text, "yoloportal_node_info", node="gpu-1", state="active", simulated="false") == 1


def test_simulated_gpus_report_fixed_zeros(node):
    _, text = scrape()
    assert value(text, "yoloportal_gpu_utilization_ratio", node="node-a", gpu="1") == 0
    assert value(text, "yoloportal_gpu_memory_used_bytes", node="node-a", gpu="1") == 0
    assert value(text, "yoloportal_node_info", node="node-a", state="active", simulated="true") == 1


def test_a_lost_node_is_down(node):
    node.last_heartbeat = timezone.now() - timedelta(hours=1)
    node.save(update_fields=["last_heartbeat"])
    assert value(scrape()[1], "yoloportal_node_up", node="node-a") == 0


def test_a_queued_job_waiting_past_its_first_estimate_shows_in_the_ratio(teams, bob):
    now = timezone.now()
    job = make_job(team=teams["vision"], user=bob, priority_class="high",
                   predicted_start_at=now - timedelta(minutes=20))
    job.created_at = now - timedelta(minutes=30)  # promised a 10-minute wait; has waited 30
    job.save(update_fields=["created_at"])
    assert value(scrape()[1], "yoloportal_queue_wait_estimate_ratio_max", **{"class": "high"}) == pytest.approx(3, 0.01)


def test_every_exported_name_is_declared(busy_cluster):
    recorders.scheduler_pass_record(0.1)
    exported = {name for name, _ in samples(scrape()[1])}
    assert exported <= metric_names()
    assert {"yoloportal_gpu_utilization_ratio", "yoloportal_job_wait_seconds_bucket",
            "yoloportal_dispatch_latency_seconds_bucket", "yoloportal_jobs_finished_total"} <= metric_names()


def test_promtool_finds_the_scrape_clean(busy_cluster):
    recorders.scheduler_pass_record(0.1)
    recorders.gpus_freed("node-a", [1], jobs_waiting=True)
    recorders.training_started("node-a", [1])
    _, text = scrape()
    result = run("promtool", "check", "metrics", stdin=text.encode())
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), (
        result.stdout.decode() + result.stderr.decode())


# --- the bearer token ----------------------------------------------------------------------


@override_settings(METRICS_TOKEN="s3cret-token")
def test_a_configured_token_is_required(db):
    assert scrape(as_prometheus=False)[0] == 401
    assert scrape(HTTP_AUTHORIZATION="Bearer wrong")[0] == 403
    assert scrape(HTTP_AUTHORIZATION="Token s3cret-token")[0] == 401
    status, text = scrape(HTTP_AUTHORIZATION="Bearer s3cret-token")
    assert status == 200 and "yoloportal_jobs" in text


@override_settings(SECURE=True, METRICS_TOKEN="", SECURE_SSL_REDIRECT=False)
def test_secure_without_a_token_keeps_metrics_closed(db):
    status, text = scrape(as_prometheus=False)
    assert status == 403 and "METRICS_TOKEN" in text


@override_settings(SECURE=True, METRICS_TOKEN="", METRICS_OPEN=True, SECURE_SSL_REDIRECT=False)
def test_metrics_open_does_not_open_a_secure_deployment(db):
    assert scrape(as_prometheus=False)[0] == 403


@override_settings(METRICS_TOKEN="", METRICS_OPEN=False)
def test_without_a_token_anonymous_callers_are_refused_unless_metrics_are_opened(db):
    """sec22: a non-DEBUG deployment that set neither SECURE nor a token served every team's jobs."""
    status, text = scrape(as_prometheus=False)
    assert status == 403 and "METRICS_TOKEN" in text and "METRICS_OPEN" in text


@override_settings(METRICS_TOKEN="", METRICS_OPEN=True)
def test_an_open_anonymous_scrape_gets_no_per_job_series(busy_cluster):
    """Job ids, teams and losses of running jobs go only to the token's holder."""
    status, text = scrape(as_prometheus=False)
    assert status == 200 and value(text, "yoloportal_jobs_running", team="vision") == 1
    assert str(busy_cluster["running"].pk) not in text
    assert "yoloportal_job_loss{" not in text and "yoloportal_job_epoch{" not in text


def test_check_deploy_warns_about_metrics_opened_without_a_token(tmp_path):
    from tests.security.test_deployment import deploy_check

    result = deploy_check(tmp_path, ALLOWED_HOSTS="portal.example.com", DEBUG="false", METRICS_OPEN="true")
    assert result.returncode != 0 and "W014" in result.stdout + result.stderr


@override_settings(SECURE=True, METRICS_TOKEN="t0k", SECURE_SSL_REDIRECT=False)
def test_secure_with_a_token_serves_metrics(db):
    assert scrape(HTTP_AUTHORIZATION="Bearer t0k")[0] == 200


def test_check_deploy_names_a_missing_metrics_token(tmp_path):
    from tests.security.test_deployment import deploy_check

    result = deploy_check(tmp_path, SECURE="true", ALLOWED_HOSTS="portal.example.com", DEBUG="false")
    assert result.returncode != 0 and "METRICS_TOKEN" in result.stdout + result.stderr


def test_a_drained_node_says_so_through_its_stop_until_resumed(node):
    """Operator trial 20, F5: drained and stopped for maintenance as docs/deploy.md says, the node
    was lost and the critical node-lost alert paged; the rule now leaves drained nodes alone."""
    from apps.cluster.services import node_drain, node_resume, node_stopped

    assert value(scrape()[1], "yoloportal_node_drained", node="node-a") == 0
    node_drain(node=node, reason="PSU replacement")
    node_stopped(node, hostname=node.hostname, worker_pid=node.worker_pid)
    _, text = scrape()
    assert value(text, "yoloportal_node_up", node="node-a") == 0
    assert value(text, "yoloportal_node_drained", node="node-a") == 1
    node.refresh_from_db()
    node.state = "draining"
    node.save(update_fields=["state"])
    node_resume(node=node)
    assert value(scrape()[1], "yoloportal_node_drained", node="node-a") == 0
