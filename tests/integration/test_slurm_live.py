"""Jobs on an existing Slurm cluster (issue 12): the portal's scheduler places them, sbatch runs
them pinned where it chose, a relay beside the training child reports to the API.

A real one-node Slurm (tests/integration/slurm.py; fake GPU device files, so training runs
on CPU), the real scheduler, web server and slurm_agent. Under CI=true a missing Slurm is a
failure.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from apps.cluster.models import ForeignAllocation, Node
from apps.core.artifacts import artifact_path
from apps.jobs.models import ExecutorAttempt, Job, JobEvent, JobState
from tests.conftest import SEED_SPEC, api_client

from .live import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
TERMINAL = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMED_OUT)
SECRETS = ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DJANGO_SETTINGS_MODULE")


def start(live, **env) -> None:
    live.start_scheduler()
    live.start("slurm_agent", "slurm_agent", **{**live.slurm_env, **env})
    wait_for(lambda: Node.objects.filter(executor="slurm").exists(), timeout=60, what="the Slurm node to register")


def submit(client, spec: str) -> str:
    response = client.post("/api/v1/jobs/", spec, content_type="application/yaml")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def slurm_job_of(job_id, attempt: int = 1) -> str:
    return wait_for(lambda: ExecutorAttempt.objects.filter(job_id=job_id, attempt=attempt).exclude(
        external_id="").values_list("external_id", flat=True).first(), timeout=120,
        what=f"attempt {attempt} to be submitted to Slurm")


def kinds(job_id) -> list[str]:
    return list(JobEvent.objects.filter(job_id=job_id).order_by("seq").values_list("kind", flat=True))


def relay_environ(job_id) -> dict[str, str]:
    """The environment of the job's relay process (its config lies in the job's folder)."""
    for entry in Path("/proc").iterdir():
        try:
            words = (entry / "cmdline").read_bytes().split(b"\0")
            if b"worker.executors.relay" in words and any(str(job_id).encode() in w for w in words):
                pairs = (entry / "environ").read_bytes().split(b"\0")
                return dict(p.decode(errors="replace").split("=", 1) for p in pairs if b"=" in p)
        except OSError:
            continue
    return {}


def test_a_job_runs_through_slurm_end_to_end(slurm, live, alice):
    start(live)
    node = Node.objects.get(executor="slurm")
    assert (node.hostname, node.partition, node.gpus.count()) == (slurm.node, "gpu", 4)
    assert node.limits["summary"].startswith("limits not enforced (Slurm TaskPlugin=task/none")
    client = api_client(alice)
    job_id = submit(client, SEED_SPEC)
    slurm_id = slurm_job_of(job_id)

    wait_for(lambda: slurm.jobs()[slurm_id]["job_state"] == "RUNNING", timeout=60, what="Slurm to run it")
    job = Job.objects.get(pk=job_id)
    shown = slurm.run("scontrol", "show", "job", "-d", slurm_id)
    assert f"JobName=yp-{job.attempt_id}" in shown and f"NodeList={slurm.node}" in shown
    assert "gres:gpu:1" in shown and "MinMemoryNode=4G" in shown and "NumCPUs=1" in shown
    environ = wait_for(lambda: relay_environ(job_id), timeout=60, what="the relay process")
    assert not set(SECRETS) & set(environ), "the Slurm node must get no database/Redis credentials"

    job = wait_for(lambda: (j := Job.objects.get(pk=job_id)).state in TERMINAL and j, timeout=300,
                   what="the job to finish")
    assert job.state == JobState.SUCCEEDED, job.error
    assert [m["epoch"] for m in client.get(f"/api/v1/jobs/{job_id}/metrics/").json()["results"]] == [1, 2]
    logs = "".join(c["text"] for c in client.get(f"/api/v1/jobs/{job_id}/logs/").json()["results"])
    assert "Ultralytics" in logs
    assert artifact_path(job.weights_path).is_file()  # rows hold artifact keys
    assert client.get("/api/v1/models/").json()["results"][0]["job"] == job_id
    assert job.checkpoints.count() >= 1
    events = kinds(job_id)
    assert events.index("slurm_submitted") < events.index("slurm_running") < events.index("training_started")
    assert events[-1] == "succeeded"
    assert slurm.jobs()[slurm_id]["job_state"] == "COMPLETED"


def test_cancel_in_the_portal_is_scancel(slurm, live, alice):
    start(live)
    client = api_client(alice)
    job_id = submit(client, SEED_SPEC.replace("epochs=2", "epochs=100"))
    slurm_id = slurm_job_of(job_id)
    wait_for(lambda: Job.objects.get(pk=job_id).epochs_done >= 1, timeout=240, what="the first epoch")
    # The relay seen alive first: otherwise the wait below for it to exit proves nothing.
    wait_for(lambda: relay_environ(job_id), timeout=60, what="the relay process")
    assert client.post(f"/api/v1/jobs/{job_id}/cancel/").status_code == 202
    wait_for(lambda: Job.objects.get(pk=job_id).state == JobState.CANCELLED, timeout=60, what="the cancel")
    assert slurm.jobs()[slurm_id]["job_state"] == "CANCELLED"
    wait_for(lambda: not relay_environ(job_id), timeout=30,
             what="the relay to exit")


def test_a_node_set_down_requeues_the_job_from_its_checkpoint(slurm, live, alice):
    start(live)
    client = api_client(alice)
    # Epochs enough that the node goes down mid-training: with 3, a loaded CI machine reported the
    # first checkpoint row late enough that attempt 1 had finished its last epoch, and attempt 2 then
    # had nothing left to train (only its "finished" event, no training_started: a fresh-clone CI run).
    job_id = submit(client, SEED_SPEC.replace("epochs=2", "epochs=8"))
    first = slurm_job_of(job_id)
    wait_for(lambda: Job.objects.get(pk=job_id).checkpoints.exists(), timeout=240, what="a checkpoint")
    slurm.run("scontrol", "update", f"nodename={slurm.node}", "state=down", "reason=yoloportal-test")
    wait_for(lambda: Job.objects.get(pk=job_id).attempt == 2, timeout=60, what="the requeue")
    assert slurm.jobs()[first]["job_state"] == "NODE_FAIL"
    event = JobEvent.objects.filter(job_id=job_id, kind="node_lost").get()
    assert f"Slurm job {first} ended NODE_FAIL on {slurm.node}" in event.message
    assert "requeued (not counted as a retry)" in event.message  # attempt 2: asserted above
    wait_for(lambda: Node.objects.get(executor="slurm").state == Node.State.DRAINING, timeout=30,
             what="the down node to stop taking work")

    slurm.run("scontrol", "update", f"nodename={slurm.node}", "state=resume")
    second = slurm_job_of(job_id, attempt=2)
    assert second != first
    job = wait_for(lambda: (j := Job.objects.get(pk=job_id)).state in TERMINAL and j, timeout=300,
                   what="attempt 2 to finish")
    assert job.state == JobState.SUCCEEDED and job.attempt == 2 and job.retries_left == 0, job.error
    resumed = JobEvent.objects.filter(job_id=job_id, kind="training_started", attempt=2).get()
    assert resumed.data["start_epoch"] >= 2  # from the checkpoint, not from scratch


def test_a_preempted_job_stops_at_its_epoch_end_and_resumes_from_it(slurm, live, alice):
    """Graceful preemption on Slurm: the relay hears "preempted" and the child stops after its
    epoch's checkpoint; the agent does not scancel it, and attempt 2 resumes from that epoch.
    Before, the relay's reports were refused and the agent scancelled it at once."""
    from django.utils import timezone

    from apps.jobs.services import attempt_preempt

    start(live)
    job_id = submit(api_client(alice), SEED_SPEC.replace("epochs=2", "epochs=8"))
    first = slurm_job_of(job_id)
    wait_for(lambda: Job.objects.get(pk=job_id).checkpoints.exists(), timeout=240, what="a checkpoint")
    attempt_preempt(Job.objects.get(pk=job_id), reason="the test needs its GPU", now=timezone.now(), grace_s=300)
    stopped = wait_for(lambda: JobEvent.objects.filter(job_id=job_id, kind="stopped_at_epoch_end").first(),
                       timeout=240, what="the victim to stop at its epoch end")
    wait_for(lambda: JobEvent.objects.filter(job_id=job_id, kind="attempt_stopped", attempt=1).exists(), timeout=60,
             what="the agent to see the victim's Slurm job end")
    assert slurm.jobs()[first]["job_state"] == "FAILED"  # its relay ended it (not a success), not scancel
    assert ExecutorAttempt.objects.get(job_id=job_id, attempt=1).report["outcome"] == "fenced"  # not timed_out
    assert slurm_job_of(job_id, attempt=2) != first
    job = wait_for(lambda: (j := Job.objects.get(pk=job_id)).state in TERMINAL and j, timeout=300,
                   what="attempt 2 to finish")
    assert job.state == JobState.SUCCEEDED and job.attempt == 2, job.error
    resumed = JobEvent.objects.filter(job_id=job_id, kind="training_started", attempt=2).get()
    assert resumed.data["start_epoch"] == stopped.data["epoch"] + 1  # no finished epoch trained twice
    assert "previous_attempt_silent" not in kinds(job_id)


def test_a_job_stuck_pending_is_withdrawn_and_requeued_through_the_portal(slurm, live, alice):
    """Slurm holds the node for someone else (a reservation the portal cannot see)."""
    start(live, SLURM_PENDING_LIMIT_S="5")
    slurm.run("scontrol", "create", "reservation", "reservationname=yp_block", "users=nobody",
              f"nodes={slurm.node}", "starttime=now", "duration=10", "flags=ignore_jobs")
    job_id = submit(api_client(alice), SEED_SPEC.replace("epochs=2", "epochs=1"))
    first = slurm_job_of(job_id)
    wait_for(lambda: Job.objects.get(pk=job_id).attempt >= 2, timeout=60, what="the withdrawal")
    assert slurm.jobs()[first]["job_state"] == "CANCELLED"
    [event] = JobEvent.objects.filter(job_id=job_id, kind="slurm_withdrawn")
    assert f"Slurm job {first} was still pending after" in event.message and "withdrawn and requeued" in event.message
    slurm.run("scontrol", "delete", "reservationname=yp_block")
    job = wait_for(lambda: (j := Job.objects.get(pk=job_id)).state in TERMINAL and j, timeout=300,
                   what="the job to run once the node is free")
    assert job.state == JobState.SUCCEEDED, job.error


def test_a_job_started_outside_the_portal_is_occupied_capacity(slurm, live, alice):
    start(live)
    outside = slurm.run("sbatch", "--parsable", "--gres=gpu:4", "--mem=100M", "-o", "/dev/null",
                        "--job-name=someone-else", "--wrap", "sleep 300").strip()
    wait_for(lambda: ForeignAllocation.objects.filter(external_id=outside).exists(), timeout=60,
             what="the agent to see the outside job")
    row = ForeignAllocation.objects.get(external_id=outside)
    assert sorted(row.gpu_indices) == [0, 1, 2, 3]
    gpus = api_client(alice).get("/api/v1/cluster/").json()["nodes"][0]["gpus"]
    assert all(g["outside"] == [f"Slurm job {outside} someone-else"] and g["allocated"] == 1 for g in gpus)

    job_id = submit(api_client(alice), SEED_SPEC.replace("epochs=2", "epochs=1"))
    wait_for(lambda: Job.objects.get(pk=job_id).reason != "waiting for the scheduler", timeout=30,
             what="a planning pass")
    assert Job.objects.get(pk=job_id).state == JobState.QUEUED  # no GPU is free, as Slurm sees it too
    slurm.run("scancel", outside)
    slurm_job_of(job_id)  # placed and submitted once the outside job has gone
    assert os.environ["SLURM_CONF"] == str(slurm.conf)
