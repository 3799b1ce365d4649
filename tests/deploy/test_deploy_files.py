"""The deployment files render and validate offline: Kubernetes (kustomize + the API schemas),
systemd (systemd-analyze verify) and Compose (structure, and every setting it passes exists)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from django.conf import settings

ROOT = Path(settings.BASE_DIR)
DEPLOY = ROOT / "deploy"
KUBERNETES_VERSION = kubernetes_validate.latest_version()


def rendered_kustomization() -> list[dict]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is needed to render deploy/kubernetes (CI machines have it)"
    out = subprocess.run([kubectl, "kustomize", str(DEPLOY / "kubernetes")], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def by_kind(docs: list[dict]) -> dict[tuple[str, str], dict]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def test_the_kustomization_renders_and_every_resource_matches_the_kubernetes_schema():
    docs = rendered_kustomization()
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    assert {("Deployment", "yoloportal-web"), ("Service", "yoloportal-web"), ("Deployment", "yoloportal-scheduler"),
            ("DaemonSet", "yoloportal-worker"), ("ConfigMap", "yoloportal-config"),
            ("Secret", "yoloportal-secrets")} <= set(by_kind(docs))


def test_the_validator_catches_a_broken_manifest():
    """The offline check is not a no-op: a misspelt field and a wrong type are refused."""
    web = by_kind(rendered_kustomization())[("Deployment", "yoloportal-web")]
    web["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(web, KUBERNETES_VERSION, strict=True)
    web["spec"]["replicas"] = 2
    web["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(web, KUBERNETES_VERSION, strict=True)


def test_one_scheduler_is_replaced_not_rolled_and_workers_ask_for_gpus():
    docs = by_kind(rendered_kustomization())
    scheduler = docs[("Deployment", "yoloportal-scheduler")]["spec"]
    assert scheduler["replicas"] == 1 and scheduler["strategy"]["type"] == "Recreate"
    assert scheduler["template"]["spec"]["initContainers"][0]["command"][-2:] == ["migrate", "--noinput"]
    worker = docs[("DaemonSet", "yoloportal-worker")]["spec"]["template"]["spec"]
    container = worker["containers"][0]
    assert "nvidia.com/gpu" in container["resources"]["limits"]
    assert worker["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in container["env"]
    for doc in docs.values():
        if doc["kind"] in ("Deployment", "DaemonSet"):
            assert doc["metadata"]["namespace"] == "yoloportal"
            for c in doc["spec"]["template"]["spec"]["containers"]:
                assert {e["configMapRef"]["name"] for e in c["envFrom"] if "configMapRef" in e} == {"yoloportal-config"}


def test_the_systemd_units_verify(tmp_path):
    """systemd-analyze verify, with the units pointed at this checkout's virtualenv."""
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is needed to check deploy/systemd"
    units = sorted((DEPLOY / "systemd").glob("*.service"))
    assert {u.name for u in units} >= {"yoloportal-web.service", "yoloportal-scheduler.service",
                                       "yoloportal-worker.service"}
    for unit in units:
        (tmp_path / unit.name).write_text(unit.read_text().replace("/opt/yoloportal", str(ROOT)))
    result = subprocess.run([analyze, "verify", "--man=no", *sorted(map(str, tmp_path.glob("*.service")))],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and not result.stderr.strip() and not result.stdout.strip(), result.stderr
    worker = (DEPLOY / "systemd" / "yoloportal-worker.service").read_text()
    assert re.search(r"^Delegate=yes$", worker, re.M)


def settings_read() -> set[str]:
    """Every environment variable yoloportal/settings.py reads."""
    source = (ROOT / "yoloportal" / "settings.py").read_text()
    return set(re.findall(r'env_\w+\(\s*"([A-Z_][A-Z0-9_]*)"', source))


def test_compose_has_the_stack_and_passes_only_settings_that_exist():
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert {"postgres", "redis", "migrate", "web", "scheduler", "worker", "prometheus", "grafana"} <= set(services)
    redis_command = " ".join(services["redis"]["command"])
    assert "--appendonly yes" in redis_command and "--maxmemory-policy noeviction" in redis_command
    devices = services["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    # WEB_WORKERS is read by the image's uvicorn command, the AWS_* credentials by boto3.
    known = settings_read() | {"WEB_WORKERS", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
    for name in ("web", "scheduler", "worker", "migrate"):
        unknown = set(services[name]["environment"]) - known
        assert not unknown, f"{name} passes settings that settings.py never reads: {unknown}"
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), f"{name} mounts {source}, which is not in deploy/"
            else:
                assert source in compose["volumes"], f"{name} uses the undeclared volume {source}"


def procfile_commands() -> dict[str, str]:
    """The long-running manage.py commands `make run` starts (Procfile), by process name: the
    installation's parts. ``redis`` is the embedded server, which deployments replace."""
    commands = {}
    for line in (ROOT / "Procfile").read_text().splitlines():
        name, _, command = line.partition(":")
        found = re.search(r"manage\.py (\w+)", command.split("&&")[-1])
        if found and name != "redis":
            commands[name] = found.group(1)
        elif "uvicorn" in command:
            commands[name] = "uvicorn"
    return commands


def test_every_part_make_run_starts_is_in_each_deployment():
    """A part `make run` starts and a deployment leaves out does not run there: notifications were
    queued and never sent from compose, systemd and Kubernetes alike (docs16 audit)."""
    parts = procfile_commands()
    assert {"web", "scheduler", "worker", "notify"} <= set(parts), parts
    wanted = {command for command in parts.values() if command != "uvicorn"}  # web: the image's own command
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    in_compose = {word for service in compose.values() for word in service.get("command", []) if isinstance(word, str)}
    units = " ".join(path.read_text() for path in (DEPLOY / "systemd").glob("*.service"))
    in_units = set(re.findall(r"manage\.py (\w+)", units))
    in_kubernetes = {word for doc in rendered_kustomization() if doc["kind"] in ("Deployment", "DaemonSet")
                     for container in doc["spec"]["template"]["spec"]["containers"]
                     for word in container.get("command", [])}
    for where, found in (("deploy/compose.yaml", in_compose), ("deploy/systemd", in_units),
                         ("deploy/kubernetes", in_kubernetes)):
        assert wanted <= found, f"{where} never runs manage.py {sorted(wanted - found)}"


def test_compose_passes_the_mail_and_link_settings_to_what_sends_notifications():
    """Operator trial 29: compose passes only the variables x-app names, and it named no NOTIFY_* nor
    PORTAL_URL (nor ARTIFACTS_S3_REGION): set in .env they never reached `notify`, whose e-mail went to
    127.0.0.1:25 inside its container. The web sends a channel's test message through the same sender."""
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    wanted = {"PORTAL_URL", "NOTIFY_SMTP_HOST", "NOTIFY_SMTP_PORT", "NOTIFY_SMTP_USER", "NOTIFY_SMTP_PASSWORD",
              "NOTIFY_SMTP_SECURITY", "NOTIFY_FROM", "ARTIFACTS_S3_REGION"}
    for name in ("notify", "web", "scheduler", "worker"):
        assert wanted <= set(compose["services"][name]["environment"]), name
    example = {line.split("=")[0] for line in (DEPLOY / "env.example").read_text().splitlines() if "=" in line}
    assert wanted <= example
