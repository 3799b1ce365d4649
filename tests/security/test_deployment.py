"""`manage.py check --deploy` is clean with production-like environment variables."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def deploy_check(tmp_path, **env) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "DEBUG", "SECURE")}
    environment.update({"DATA_DIR": str(tmp_path), "DJANGO_SETTINGS_MODULE": "yoloportal.settings", **env})
    return subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
                          cwd=ROOT, env=environment, capture_output=True, text=True, timeout=60)


def test_check_deploy_is_clean_with_production_settings(tmp_path):
    """SECURE=true, real hosts, and the secret key generated under DATA_DIR (no SECRET_KEY given)."""
    result = deploy_check(tmp_path, SECURE="true", ALLOWED_HOSTS="portal.example.com", DEBUG="false",
                          METRICS_TOKEN="a-long-random-scrape-token")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_check_deploy_names_what_is_missing_without_https(tmp_path):
    result = deploy_check(tmp_path, ALLOWED_HOSTS="portal.example.com")
    assert result.returncode != 0
    assert "SESSION_COOKIE_SECURE" in result.stderr + result.stdout
