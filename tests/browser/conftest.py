"""Playwright driving Debian's Chromium against a real uvicorn server on the test database.

Screenshots go to test-artifacts/browser/ (gitignored).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from django.conf import settings

from tests.integration.live import LiveSystem
from tests.portal.liveweb import WebServer

CHROMIUM = os.environ.get("CHROMIUM_PATH") or shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(settings.BASE_DIR) / "test-artifacts" / "browser"


@pytest.fixture
def live_portal(transactional_db, redis_server, tmp_path, demo_registered, clean_storage, monkeypatch, request):
    """(LiveSystem, WebServer): start the scheduler and worker from the test when it needs them."""
    # Playwright's sync API runs an event loop in this thread; the test's own ORM calls are
    # still plain synchronous code.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    system = LiveSystem(tmp_path, redis_server.url)
    server = WebServer(system, tmp_path)
    yield system, server
    server.stop()
    system.stop_all()
    if getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed:
        for name in ("web", "scheduler", "worker"):
            print(f"----- {name} log -----\n{(tmp_path / f'{name}.log').read_text(errors='replace')[-6000:] if (tmp_path / f'{name}.log').exists() else ''}")


@pytest.fixture
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"Chromium not found at {CHROMIUM} (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield instance
        instance.close()


class PageErrors(list):
    """Console errors and uncaught exceptions seen by a page."""


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.errors = PageErrors()
    page.on("pageerror", lambda exc: page.errors.append(f"uncaught: {exc}"))
    page.on("console", lambda msg: page.errors.append(f"console: {msg.text}") if msg.type == "error" else None)
    page.on("dialog", lambda dialog: dialog.accept())
    yield page
    context.close()


def screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def sign_in(page, base_url: str, username: str, password: str) -> None:
    page.goto(f"{base_url}/accounts/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base_url}/")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)
