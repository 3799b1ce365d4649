"""A GPU server on the shared filesystem starts only where it sees the installation's storage
(operator trial 20, F6)."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from apps.cluster.models import Node
from worker.artifacts import shared_storage_problem

pytestmark = pytest.mark.django_db


@pytest.mark.timeout(60)  # before the fix the worker started and ran until killed
def test_a_worker_with_a_data_dir_of_its_own_refuses_to_start_and_says_why(demo_registered, settings, tmp_path):
    """Started with DATA_DIR=/srv/node2 and no bucket, it registered, took jobs and failed each one
    for good ("dataset YAML not found: demo/data.yaml")."""
    settings.DATASETS_DIR = tmp_path / "node2" / "datasets"  # this machine's own, empty disk
    with pytest.raises(CommandError) as refused:
        call_command("gpu_worker", "--name", "gpu-07", "--simulate-gpus", "1")
    said = str(refused.value)
    assert said.startswith("node gpu-07 not started: this machine's artifact storage lacks ")
    assert "demo" in said and "every machine must mount the same DATA_DIR at the same path" in said
    assert "ARTIFACTS_S3_" in said
    assert not Node.objects.filter(name="gpu-07").exists()  # never registered: the scheduler sends it nothing


def test_the_shared_storage_and_an_empty_installation_pass(demo_registered, settings, tmp_path):
    assert shared_storage_problem() == ""
    from apps.datasets.models import Dataset

    Dataset.objects.all().delete()
    settings.DATASETS_DIR = tmp_path / "elsewhere"
    assert shared_storage_problem() == ""  # no dataset yet: nothing to look for


def test_one_lost_dataset_file_does_not_keep_a_worker_on_the_shared_storage_from_starting(demo_registered):
    """Only when none of the newest three datasets is where the database says is the storage not this
    machine's: one file lost on the shared storage must not stop every worker of the cluster."""
    from apps.datasets.models import Dataset

    lost = Dataset.objects.order_by("-created_at").first()
    lost.pk, lost.version = None, lost.version + 1
    lost.key, lost.yaml_key = f"{lost.key}-lost", f"{lost.key}-lost/data.yaml"
    lost.save()
    assert shared_storage_problem() == ""
