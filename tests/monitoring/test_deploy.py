"""deploy/prometheus, deploy/alertmanager and deploy/grafana: checked by Prometheus' own tools,
and every metric they name is one /metrics exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from django.conf import settings

from apps.monitoring.collector import metric_names

from .tools import run

DEPLOY = Path(settings.BASE_DIR) / "deploy"
RULES = DEPLOY / "prometheus" / "rules" / "yoloportal.rules.yml"
RULE_TESTS = DEPLOY / "prometheus" / "tests" / "yoloportal.test.yml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "yoloportal.json"
ALERTS = {"YoloportalNodeLost", "YoloportalGpusIdleWhileJobsWait", "YoloportalJobFailureRateHigh",
          "YoloportalSchedulerNotPlanning", "YoloportalRedisUnreachable", "YoloportalQueuedJobsLate",
          "YoloportalNodeStorageUnreachable", "YoloportalMetricsUnreachable"}
METRIC = re.compile(r"\byoloportal_[a-z0-9_]+")


def output(result) -> str:
    return (result.stdout + result.stderr).decode()


def test_promtool_accepts_the_scrape_config():
    result = run("promtool", "check", "config", "--syntax-only", str(DEPLOY / "prometheus" / "prometheus.yml"))
    assert result.returncode == 0, output(result)


def test_promtool_accepts_the_rules():
    result = run("promtool", "check", "rules", str(RULES))
    assert result.returncode == 0 and "SUCCESS: 8 rules found" in output(result), output(result)


def test_the_rule_unit_tests_pass():
    result = run("promtool", "test", "rules", str(RULE_TESTS))
    assert result.returncode == 0 and "SUCCESS" in output(result), output(result)


def test_each_alert_has_unit_tests_that_fire_and_that_stay_quiet():
    alerts = {rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]}
    assert alerts == ALERTS
    fires, quiet = set(), set()
    for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (fires if check.get("exp_alerts") else quiet).add(check["alertname"])
    assert fires == ALERTS and quiet == ALERTS


def test_amtool_accepts_the_alertmanager_config():
    result = run("amtool", "check-config", str(DEPLOY / "alertmanager" / "alertmanager.yml"))
    assert result.returncode == 0 and "SUCCESS" in output(result), output(result)


def names_in(text: str) -> set[str]:
    return set(METRIC.findall(text))


def test_every_metric_the_rules_use_is_exported():
    exprs = " ".join(rule["expr"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"])
    used = names_in(exprs)
    assert used and used <= metric_names(), used - metric_names()


def test_the_scrape_alert_watches_the_scrape_job_prometheus_yml_names():
    """YoloportalMetricsUnreachable reads Prometheus' own ``up`` of the job scraping /metrics: a job
    renamed in one file and not the other would leave the alert watching nothing (operator trial 31)."""
    scrape = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())["scrape_configs"]
    rules = {rule["alert"]: rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]}
    assert [job["job_name"] for job in scrape] == ["yoloportal"]
    assert rules["YoloportalMetricsUnreachable"]["expr"].strip() == 'up{job="yoloportal"} == 0'


def test_every_metric_the_dashboard_uses_is_exported():
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = " ".join(target["expr"] for panel in dashboard["panels"] for target in panel["targets"])
    used = names_in(exprs)
    assert len(used) >= 15 and used <= metric_names(), used - metric_names()


def test_the_dashboard_has_the_panels_operators_asked_for():
    titles = " | ".join(p["title"] for p in json.loads(DASHBOARD.read_text())["panels"]).lower()
    for wanted in ("gpu allocation", "utilisation", "queue by team and class", "wait", "gpu-hours per team",
                   "quota", "by reason", "scheduler pass", "live loss", "dispatch latency"):
        assert wanted in titles, wanted


def test_the_dashboard_and_datasource_provisioning_agree():
    dashboard = json.loads(DASHBOARD.read_text())
    source = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text())
    uid = source["datasources"][0]["uid"]
    assert {t["datasource"]["uid"] for p in dashboard["panels"] for t in p["targets"]} == {uid}
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
