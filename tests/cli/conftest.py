from __future__ import annotations

import pytest

from tests.integration.live import LiveSystem
from tests.portal.liveweb import WebServer


@pytest.fixture
def web(transactional_db, redis_server, tmp_path, demo_registered):
    """The portal served by uvicorn (tests/portal/liveweb.py) on the test database (no scheduler or worker)."""
    server = WebServer(LiveSystem(tmp_path, redis_server.url), tmp_path)
    yield server
    server.stop()


@pytest.fixture
def config(tmp_path, monkeypatch):
    """yoloq's config file in the test's own home, no URL or token from the environment."""
    path = tmp_path / "home" / "yoloq" / "config.json"
    monkeypatch.setenv("YOLOQ_CONFIG", str(path))
    monkeypatch.delenv("YOLOQ_URL", raising=False)
    monkeypatch.delenv("YOLOQ_TOKEN", raising=False)
    return path
