"""Fixtures shared by the security-area test folders (imported by their conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    """PBKDF2 costs ~0.3 s per persona on a small machine; these tests are not about hashing."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
