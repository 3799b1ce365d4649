"""A GPU server tells that it sees this installation's shared storage by the marker the scheduler
writes into each shared root (apps/core/storage_marks.py), not by the datasets' files.

Before, a separate mount for JOBS_DIR or WEIGHTS_DIR that dropped alone went unseen, and the
newest three datasets' files deleted by hand took every node out of placement. A root pointed
at an empty folder is that node's view of a mount that dropped (the scheduler, in the same
process here, keeps the real one)."""

from __future__ import annotations

import shutil

import pytest
from django.core.management import CommandError, call_command

from apps.cluster.models import Node
from apps.core.models import StorageMark
from apps.core.storage_marks import MARKER_NAME, storage_marks_write
from apps.scheduling.inputs import cluster_nodes
from apps.scheduling.management.commands.scheduler import Chores
from worker.artifacts import shared_storage_problem
from worker.node import Heartbeat

pytestmark = pytest.mark.django_db


def register(name: str = "node-a") -> Node:
    from apps.cluster.services import node_register
    from worker.inventory import simulated_gpus

    return node_register(name=name, gpus=simulated_gpus(1), cpu_count=8, memory_mb=32768,
                         hostname=f"host-{name}", worker_pid=1234)


def placement(name: str = "node-a") -> tuple[bool, str]:
    (info,) = cluster_nodes(Node.objects.filter(name=name))
    return info.schedulable, info.unschedulable_because


@pytest.fixture
def marked(demo_registered, settings):
    """The installation as its scheduler leaves it: the marker in every shared root."""
    Chores().storage_marks()  # the scheduler's own chore
    return {name: getattr(settings, name) for name in ("DATASETS_DIR", "JOBS_DIR", "MODELS_DIR", "WEIGHTS_DIR")}


def test_the_scheduler_marks_every_shared_root_with_the_installations_token(marked):
    token = StorageMark.objects.get().token
    for folder in marked.values():
        assert (folder / MARKER_NAME).read_text().strip() == token
    assert StorageMark.objects.get().written_at is not None  # from now on the nodes check
    assert storage_marks_write() == 0  # a second pass has nothing to do


def test_a_node_whose_jobs_mount_dropped_alone_is_marked_naming_that_root_and_is_back_with_it(
        marked, settings, tmp_path):
    """Datasets still readable, so the old datasets-only check saw nothing wrong."""
    node = register()
    beat = Heartbeat(node, 1.0, simulated=True)
    beat.beat()
    assert placement() == (True, "")

    settings.JOBS_DIR = tmp_path / "mountpoint" / "jobs"  # this node's view: the empty mount point
    beat.beat()
    node = Node.objects.get(name="node-a")
    assert node.storage_problem == "shared storage unreachable: JOBS_DIR (no storage marker)"
    assert node.state == Node.State.ACTIVE  # reporting, not drained
    assert placement() == (False, "shared storage unreachable")

    settings.JOBS_DIR = marked["JOBS_DIR"]  # mounted again
    beat.beat()
    assert Node.objects.get(name="node-a").storage_problem == ""
    assert placement() == (True, "")


def test_a_weights_mount_of_another_installations_export_is_named_as_such(marked, settings, tmp_path):
    other = tmp_path / "other-export" / "weights"
    other.mkdir(parents=True)
    (other / MARKER_NAME).write_text("0123456789abcdef\n")  # another installation's scheduler wrote it
    settings.WEIGHTS_DIR = other
    node = register()
    Heartbeat(node, 1.0, simulated=True).beat()
    assert Node.objects.get(name="node-a").storage_problem == (
        "shared storage unreachable: WEIGHTS_DIR (another installation's storage marker)")


@pytest.fixture
def datasets_deleted(settings, tmp_path):
    """Every dataset's files gone from the storage (kept aside here: the session's demo dataset
    is every test's)."""
    aside = tmp_path / "aside"
    aside.mkdir()
    moved = [shutil.move(child, aside / child.name) for child in settings.DATASETS_DIR.iterdir()
             if child.name != MARKER_NAME]
    assert moved
    yield
    for child in aside.iterdir():
        shutil.move(child, settings.DATASETS_DIR / child.name)


def test_deleted_dataset_files_alone_leave_every_node_schedulable(marked, datasets_deleted):
    """The newest three datasets' files removed by hand (the storage itself fine): before, every
    node was marked unreachable and nothing was placed anywhere."""
    for name in ("node-a", "node-b"):
        Heartbeat(register(name), 1.0, simulated=True).beat()
        assert Node.objects.get(name=name).storage_problem == ""
        assert placement(name) == (True, "")
    assert shared_storage_problem() == ""  # and a worker starting now starts


@pytest.mark.timeout(60)
def test_a_worker_whose_view_lacks_the_marker_refuses_to_start_naming_the_root_and_its_path(
        marked, settings, tmp_path):
    settings.WEIGHTS_DIR = tmp_path / "node2" / "weights"
    with pytest.raises(CommandError) as refused:
        call_command("gpu_worker", "--name", "gpu-07", "--simulate-gpus", "1")
    said = str(refused.value)
    assert said.startswith("node gpu-07 not started: this machine's artifact storage lacks this installation's "
                           f"storage marker in WEIGHTS_DIR: {settings.WEIGHTS_DIR / MARKER_NAME} (no storage marker)")
    assert not Node.objects.filter(name="gpu-07").exists()


def test_a_marker_deleted_by_hand_is_written_again_by_the_schedulers_next_chore(marked):
    (marked["MODELS_DIR"] / MARKER_NAME).unlink()
    assert shared_storage_problem() != ""  # meanwhile every node would say MODELS_DIR
    Chores().storage_marks()
    assert shared_storage_problem() == ""


def test_the_scheduler_leaves_another_installations_marker_alone_and_the_nodes_keep_the_datasets_check(
        demo_registered, settings, tmp_path, caplog):
    """Overwriting it would hide a mount of the wrong export from every node; until every root
    holds this installation's token nobody checks for it."""
    other = tmp_path / "other-export" / "jobs"
    other.mkdir(parents=True)
    (other / MARKER_NAME).write_text("0123456789abcdef\n")
    settings.JOBS_DIR = other
    storage_marks_write()
    assert (other / MARKER_NAME).read_text() == "0123456789abcdef\n"
    assert "holds another installation's storage marker" in caplog.text
    assert StorageMark.objects.get().written_at is None
    assert shared_storage_problem() == ""  # the datasets are there: the fallback passes


def test_with_an_object_store_nothing_is_marked_or_checked(demo_registered, settings, moto):
    from django.test import override_settings

    from tests.s3 import s3_storages

    with override_settings(STORAGES=s3_storages(moto)):  # the roots are each node's own cache then
        assert storage_marks_write() == 0
        Heartbeat(register(), 1.0, simulated=True).beat()
    assert not (settings.JOBS_DIR / MARKER_NAME).exists()
    assert Node.objects.get(name="node-a").storage_problem == ""
