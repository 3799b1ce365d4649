from __future__ import annotations

import pytest

from tests.security.fast import _fast_password_hashing  # noqa: F401

from .receivers import MailServer, WebhookReceiver


@pytest.fixture
def receiver():
    server = WebhookReceiver().start()
    yield server
    server.stop()


@pytest.fixture
def mail_server():
    server = MailServer().start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def _local_receivers_allowed(settings):
    """The receivers below listen on 127.0.0.1, which production settings refuse (SSRF)."""
    settings.NOTIFY_ALLOW_PRIVATE_TARGETS = True
