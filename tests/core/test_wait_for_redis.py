"""manage.py wait_for_redis (each make run process's first step) refuses another installation's
embedded Redis on EMBEDDED_REDIS_PORT (optrial24: a second make run on a taken port started its
web, scheduler and worker against the first installation's queues until honcho stopped them)."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from apps.core.redis_server import RedisServer


@pytest.fixture
def other_redis(tmp_path):
    server = RedisServer(data_dir=tmp_path / "other" / "redis").start()
    yield server
    server.stop()


def test_another_installations_embedded_redis_is_refused_naming_the_port_setting(other_redis, settings, tmp_path,
                                                                                  monkeypatch):
    monkeypatch.delenv("REDIS_URL", raising=False)
    settings.REDIS_URL, settings.EMBEDDED_REDIS_PORT = other_redis.url, other_redis.port
    settings.DATA_DIR = tmp_path / "mine"
    with pytest.raises(CommandError) as refused:
        call_command("wait_for_redis", "--timeout", "5")
    message = str(refused.value)
    assert f"127.0.0.1:{other_redis.port} is not this installation's" in message
    assert str((tmp_path / "other" / "redis").resolve()) in message and "EMBEDDED_REDIS_PORT" in message


def test_its_own_embedded_redis_and_a_configured_redis_url_pass(other_redis, settings, tmp_path, monkeypatch):
    monkeypatch.delenv("REDIS_URL", raising=False)
    settings.REDIS_URL, settings.EMBEDDED_REDIS_PORT = other_redis.url, other_redis.port
    settings.DATA_DIR = tmp_path / "other"  # its redis folder: this installation's own
    call_command("wait_for_redis", "--timeout", "5")
    settings.DATA_DIR = tmp_path / "mine"
    monkeypatch.setenv("REDIS_URL", other_redis.url)  # shared on purpose (multi-node): not checked
    call_command("wait_for_redis", "--timeout", "5")
