"""``yoloq continue`` against a live server: an ended job continues from its newest stored checkpoint
as a new job (apps/jobs/continuation.py); a refusal names the problem."""

from __future__ import annotations

import pytest

from apps.jobs.models import Job
from apps.jobs.services import attempt_finish, attempt_start, job_claim
from tests.conftest import SEED_SPEC, api_client
from tests.jobs.test_continue import checkpoint

from .test_yoloq_manager import login, run

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_continue_queues_the_rest_with_a_new_timeout_and_refuses_an_active_job(web, config, alice, node,
                                                                              clean_storage, capsys):
    job_id = api_client(alice).post("/api/v1/jobs/", SEED_SPEC.replace("epochs=2", "epochs=6"),
                                    content_type="application/yaml").json()["id"]
    job = Job.objects.get(pk=job_id)
    assert job_claim(job, node=node, gpu_indices=[0], gpu_share=1.0, run_class="medium")
    job = attempt_start(job_id=job.pk, attempt_id=job.attempt_id, node_name="node-a")
    checkpoint(job, 1)
    checkpoint(job, 2)
    attempt_finish(job, outcome="timed_out", exit_code=-15)
    login(web, alice, capsys)

    code, out, err = run(capsys, "continue", job_id[:8], "--timeout", "900", "--memory", "6Gi", "--gpus", "0.5",
                            "--no-val")

    new = Job.objects.exclude(pk=job_id).get()
    assert code == 0, err
    assert f"Continuing {job_id} ({job.task_name}) from epoch 2 as job {new.pk}: queued" in out
    assert new.timeout_s == 900 and new.spec["continued_from"]["job"] == job_id
    assert new.memory_mb == 6144 and job.memory_mb == 4096  # more for a job that ran out of memory
    assert new.gpus == 0.5 and job.gpus == 1  # fewer, under a newly lowered per-job limit (trial31)
    assert new.spec["train_args"]["val"] is False  # a dataset whose val split has no labels (left32)
    code, _, err = run(capsys, "continue", str(new.pk)[:8])
    assert code == 1
    assert "state: job is queued; only an ended job (failed, cancelled or timed out) can be continued" in err
