"""A sweep whose trials trained on GPU servers without the shared DATA_DIR: the scheduler registers
the best trial's weights from the artifact store (a real moto_server), fetched into its own cache
and checked against the sha256 the trial recorded, and while the store is unreachable the sweep
waits, running, with the reason on its row. (The live version, with a worker on its own DATA_DIR
and real training, is in tests/integration/test_storage_nodes.py.)"""

from __future__ import annotations

import time

import pytest
from django.test import override_settings

from apps.core.artifacts import artifact_path
from apps.core.storage import artifact_upload
from apps.jobs.models import Job, JobEvent, JobState
from apps.registry.models import ModelVersion
from apps.sweeps.services import STORE_WAIT_FIRST_S, sweeps_advance
from tests.s3 import free_port, s3_storages

from .conftest import submit_sweep, train, trial_jobs

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


def test_the_best_trial_is_registered_from_the_store_and_the_sweep_waits_while_it_is_down(
        sweeper, node, moto, settings, tmp_path):
    settings.ARTIFACTS_CACHE_DIR = tmp_path / "scheduler-cache"
    store, down = s3_storages(moto), s3_storages({**moto, "url": f"http://127.0.0.1:{free_port()}"})
    with override_settings(STORAGES=store):
        parent = submit_sweep(sweeper, parameters={"lr0": [0.01, 0.001]}, method="grid", parallel=2)
        sweeps_advance()
        trials = trial_jobs(parent)
        for job, final in zip(trials, (0.30, 0.55), strict=True):
            train(job, node, [final], gpu=0)
            # What the GPU server does before the success (worker.artifacts.results_upload); its disk
            # is not this machine's.
            key = Job.objects.get(pk=job.pk).weights_path
            artifact_upload(key, artifact_path(key))
            artifact_path(key).unlink()
    best = Job.objects.get(pk=trials[1].pk)
    recorded = JobEvent.objects.get(job=best, kind="succeeded").data["weights_sha256"]

    with override_settings(STORAGES=down):
        sweeps_advance()
        sweeps_advance()  # within the pause: not tried again
    parent.refresh_from_db()
    assert parent.state == JobState.RUNNING
    assert parent.reason.startswith("waiting for artifact storage (the best trial's weights)"), parent.reason
    assert JobEvent.objects.filter(job=parent, kind="storage_wait").count() == 1
    assert not ModelVersion.objects.exists()

    time.sleep(STORE_WAIT_FIRST_S + 0.1)
    with override_settings(STORAGES=store):
        sweeps_advance()
    parent.refresh_from_db()
    assert parent.state == JobState.SUCCEEDED and parent.reason == ""
    assert JobEvent.objects.filter(job=parent, kind="storage_back").exists()
    version = ModelVersion.objects.get()
    assert (version.job_id, version.weights_key, version.sha256) == (best.pk, best.weights_path, recorded)
    cached = settings.ARTIFACTS_CACHE_DIR / recorded[:2] / recorded / "best.pt"
    assert cached.read_bytes() == f"weights of {best.pk}".encode()
    assert f"registered as {version}" in JobEvent.objects.get(job=parent, kind="succeeded").message
