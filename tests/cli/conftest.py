from __future__ import annotations

import pytest

from tests.integration.live import LiveSystem
from tests.portal.liveweb import WebServer


@pytest.fixture
def web(transactional_db, redis_server, tmp_path, demo_registered):
    """The portal served by daphne on the test database (no scheduler or worker)."""
    server = WebServer(LiveSystem(tmp_path, redis_server.url), tmp_path)
    yield server
    server.stop()
