from __future__ import annotations

import pytest

from .live import LiveSystem


@pytest.fixture
def live(transactional_db, redis_server, tmp_path, demo_registered, clean_storage, request):
    """Scheduler and worker subprocesses are started by the test; all are killed afterwards."""
    system = LiveSystem(tmp_path, redis_server.url)
    yield system
    system.stop_all()
    if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
        for name in ("scheduler", "worker", "worker2"):
            print(f"----- {name} log -----\n{system.log(name)[-6000:]}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)
