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
        for name in ("scheduler", "worker", "worker2", "slurm_agent", "web"):
            print(f"----- {name} log -----\n{system.log(name)[-6000:]}")
        print(jobs_as_seen())


def jobs_as_seen() -> str:
    """Every job's row and last events, for a failed live test: the scheduler logs little."""
    from apps.cluster.models import Node
    from apps.jobs.models import Job, JobEvent

    lines = ["----- jobs -----"]
    for job in Job.objects.order_by("created_at"):
        lines.append(f"{job.pk} {job.task_name!r} {job.state} attempt {job.attempt} node {job.node_id} "
                     f"gpus {job.gpu_indices} position {job.queue_position} reason {job.reason!r}")
        for event in JobEvent.objects.filter(job_id=job.pk).order_by("-seq")[:15][::-1]:
            lines.append(f"    {event.created_at:%H:%M:%S.%f} a{event.attempt} {event.kind}: {event.message[:160]}")
    for node in Node.objects.all():
        lines.append(f"node {node.name} {node.state}: last heartbeat {node.last_heartbeat}")
    return "\n".join(lines)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


@pytest.fixture(scope="session")
def slurm_cluster():
    """A real one-node Slurm (tests/integration/slurm.py). Under CI=true a missing Slurm fails."""
    import os

    from .slurm import start_slurm

    cluster = start_slurm()
    if cluster is None:
        if os.environ.get("CI"):
            pytest.fail("CI must have Slurm (Debian slurm-wlm + munge, installed by .ci/run), run as root")
        pytest.skip("no Slurm here (slurm-wlm + munge, as root)")
    os.environ["SLURM_CONF"] = str(cluster.conf)  # the live processes inherit it
    yield cluster
    cluster.resume()
    cluster.stop()


@pytest.fixture
def slurm(slurm_cluster, live, tmp_path):
    """The live system with a web server (the relays report to it) and a slurm_agent for the partition."""
    from tests.portal.liveweb import WebServer

    slurm_cluster.resume()
    web = WebServer(live, tmp_path)
    live.slurm_env = {"SLURM_PORTAL_URL": web.url, "SLURM_PARTITION": slurm_cluster.partition,
                      "SLURM_SIMULATED_GPUS": "true", "SLURM_POLL_S": "0.3", "SLURM_SYNC_S": "1",
                      "SLURM_SIGNAL_S": "30", **slurm_cluster.env()}
    yield slurm_cluster
    web.stop()
    slurm_cluster.resume()
