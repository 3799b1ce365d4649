"""Artifact storage (apps/core/storage.py): the shared filesystem by default, an
S3-compatible store against a real ``moto_server`` process, the node-local cache keyed by
sha256, and a clear error while the store is unreachable."""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path

import pytest
from django.test import override_settings

from apps.core.artifacts import artifact_path
from apps.core.storage import (
    ArtifactChanged,
    StorageUnavailable,
    artifact_local,
    artifact_read,
    artifact_upload,
    cache_path,
    shared_filesystem,
)
from tests.s3 import s3_storages, stop_moto

pytestmark = pytest.mark.integration


def weights_file(tmp_path, size: int = 300_000) -> tuple[Path, str]:
    path = tmp_path / "best.pt"
    path.write_bytes(os.urandom(size))
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def test_by_default_artifacts_are_files_under_their_roots(tmp_path, settings):
    settings.ARTIFACTS_CACHE_DIR = tmp_path / "cache"
    folder = f"datasets/_shared/big-{uuid.uuid4().hex[:8]}"  # one object serves all three readers
    key = f"{folder}/images/best.pt"
    local, sha = weights_file(tmp_path)
    assert shared_filesystem()
    assert artifact_upload(key, local) == sha
    assert artifact_path(key).read_bytes() == local.read_bytes()
    assert artifact_local(key, sha) == artifact_path(key)  # read in place: nothing cached
    assert not (tmp_path / "cache").exists()
    with artifact_read(key) as handle:
        assert handle.read() == local.read_bytes()
    local.write_bytes(b"a second training run")
    artifact_upload(key, local)  # the same key again replaces the file
    assert artifact_path(key).read_bytes() == b"a second training run"


def test_s3_stores_by_key_and_nodes_fetch_into_a_hash_keyed_cache(tmp_path, settings, moto):
    settings.ARTIFACTS_CACHE_DIR = tmp_path / "node-cache"
    folder = f"datasets/_shared/big-{uuid.uuid4().hex[:8]}"  # one object serves all three readers
    key = f"{folder}/images/best.pt"
    local, sha = weights_file(tmp_path)
    with override_settings(STORAGES=s3_storages(moto)):
        assert not shared_filesystem()
        assert artifact_upload(key, local) == sha
        assert not artifact_path(key).exists()  # in the bucket, not on this disk
        import boto3

        s3 = boto3.client("s3", endpoint_url=moto["url"], aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1")
        assert s3.get_object(Bucket=moto["bucket"], Key=key)["Body"].read() == local.read_bytes()

        fetched = artifact_local(key, sha)
        assert fetched == cache_path(sha, "best.pt") == tmp_path / "node-cache" / sha[:2] / sha / "best.pt"
        assert fetched.read_bytes() == local.read_bytes()
        # Cached: found again without the store (the object is gone now).
        s3.delete_object(Bucket=moto["bucket"], Key=key)
        assert artifact_local(key, sha) == fetched
        with pytest.raises(FileNotFoundError):
            artifact_read(key).read()

        # A different recorded hash: refused, and nothing half-written stays in the cache.
        other = f"jobs/{uuid.uuid4()}/weights/last.pt"
        artifact_upload(other, local)
        with pytest.raises(ArtifactChanged):
            artifact_local(other, "0" * 64)
        assert not any(p.name.startswith(".fetch-") for p in (tmp_path / "node-cache").rglob("*"))
        assert not cache_path("0" * 64, "last.pt").exists()


def test_an_unreachable_store_is_a_clear_error_not_a_crash(tmp_path, settings, moto):
    settings.ARTIFACTS_CACHE_DIR = tmp_path / "node-cache"
    local, sha = weights_file(tmp_path, 1000)
    folder = f"datasets/_shared/big-{uuid.uuid4().hex[:8]}"  # one object serves all three readers
    key = f"{folder}/images/best.pt"
    storages = s3_storages(moto)
    storages["artifacts"]["OPTIONS"]["client_config"] = __import__("botocore.config").config.Config(
        connect_timeout=2, read_timeout=5, retries={"max_attempts": 1})
    with override_settings(STORAGES=storages):
        artifact_upload(key, local)
        stop_moto(moto["process"])
        with pytest.raises(StorageUnavailable, match="unreachable"):
            artifact_local(key, sha)
        with pytest.raises(StorageUnavailable, match="unreachable"):
            artifact_upload(f"jobs/{uuid.uuid4()}/weights/best.pt", local)
        assert not cache_path(sha, "best.pt").exists()


@pytest.mark.django_db
def test_a_node_fetches_a_dataset_that_was_trained_on_in_place(tmp_path, settings, moto, teams):
    """CI 12:3x: the demo had been trained on (labels/*.cache) before it was registered, its
    recorded hash counted the caches, the node skipped them: 'manifest … in storage, … recorded'."""
    import shutil

    import yaml

    from apps.core.artifacts import artifact_key
    from apps.datasets.demo import generate_demo_dataset
    from apps.datasets.services import dataset_register
    from worker.artifacts import dataset_local

    root = settings.DATASETS_DIR / "_shared" / f"trained-{uuid.uuid4().hex[:8]}"
    try:
        data_yaml = generate_demo_dataset(root, train=2, val=1, imgsz=32)  # its data.yaml names `path: <root>`
        (root / "labels" / "train.cache").write_bytes(b"\x80\x04 a pickled label cache")
        sorted((root / "images" / "train").iterdir())[0].with_suffix(".npy").write_bytes(b"\x93NUMPY")
        dataset = dataset_register(team=teams["vision"], name="trained", yaml_path=data_yaml)
        images = sorted(p.relative_to(root) for p in root.rglob("*.jpg"))
        settings.ARTIFACTS_CACHE_DIR = tmp_path / "node-cache"
        with override_settings(STORAGES=s3_storages(moto)):
            for path in sorted(root.rglob("*")):  # everything, caches too (as a DATA_DIR pushed before the rule)
                if path.is_file():
                    artifact_upload(artifact_key(path), path)
            fetched = dataset_local(dataset.yaml_key, dataset.sha256)
            assert dataset_local(dataset.yaml_key, dataset.sha256) == fetched  # cached: complete
    finally:
        shutil.rmtree(root, ignore_errors=True)
    folder = fetched.parent
    assert folder == cache_path(dataset.sha256, "dataset")
    assert not [p for p in folder.rglob("*") if p.suffix in (".cache", ".npy")]
    assert len(images) == 3 and sorted(p.relative_to(folder) for p in folder.rglob("*.jpg")) == images
    # Ultralytics on the node reads (and writes its caches into) the node's copy, not the web's folder.
    assert yaml.safe_load(fetched.read_text())["path"] == str(folder)


def test_a_large_object_is_fetched_and_read_from_the_store_in_bounded_memory(tmp_path, settings, moto):
    """64 MiB through artifact_local (into the node cache), artifact_read (a download without a
    recorded hash) and dataset_local (a dataset folder fetched file by file onto a GPU server): the
    bytes arrive unchanged and this process's heap grows by a few MiB at most.
    (django-storages' S3File downloads the whole object into a SpooledTemporaryFile that, with
    AWS_S3_MAX_MEMORY_SIZE at its default 0, never moves to disk: 64 MiB in memory.)"""
    import tracemalloc

    from worker.artifacts import dataset_local

    settings.ARTIFACTS_CACHE_DIR = tmp_path / "node-cache"
    size = 64 << 20
    local = tmp_path / "big.pt"
    with open(local, "wb") as out:
        out.truncate(size)
        for n in range(size >> 20):
            out.seek(n << 20)
            out.write(n.to_bytes(8, "big") * 4)
    sha = hashlib.sha256(local.read_bytes()).hexdigest()
    folder = f"datasets/_shared/big-{uuid.uuid4().hex[:8]}"  # one object serves all three readers
    key = f"{folder}/images/best.pt"

    def peak_growth(action):
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            result = action()
            return result, tracemalloc.get_traced_memory()[1] - before
        finally:
            tracemalloc.stop()

    def read_through():
        digest = hashlib.sha256()
        with artifact_read(key) as handle:
            while block := handle.read(64 << 10):
                digest.update(block)
        return digest.hexdigest()

    with override_settings(STORAGES=s3_storages(moto)):
        artifact_upload(key, local)
        fetched, fetched_peak = peak_growth(lambda: artifact_local(key, sha))
        read, read_peak = peak_growth(read_through)
        dataset, dataset_peak = peak_growth(lambda: dataset_local(f"{folder}/data.yaml", ""))
    print(f"heap peak growth for {size >> 20} MiB: artifact_local {fetched_peak / 2**20:.1f} MiB, "
          f"artifact_read {read_peak / 2**20:.1f} MiB, dataset_local {dataset_peak / 2**20:.1f} MiB")
    assert hashlib.sha256(fetched.read_bytes()).hexdigest() == sha and read == sha
    assert hashlib.sha256((dataset.parent / "images" / "best.pt").read_bytes()).hexdigest() == sha
    assert fetched_peak < 8 << 20 and read_peak < 8 << 20 and dataset_peak < 8 << 20, (
        fetched_peak, read_peak, dataset_peak)


@pytest.mark.django_db
def test_a_dataset_another_slot_fetched_first_is_kept_and_this_fetch_goes_on(tmp_path, settings, moto, teams,
                                                                              monkeypatch):
    """Two slots of one node fetched one dataset at once (a sweep's trial beside a job, CI 5 December):
    the later one removed the copy the first had renamed into place — which it may be training from —
    and raced its rename ("Directory not empty": the attempt failed). A copy checked against the
    manifest is the same files: it is kept, and this fetch answers with it."""
    import shutil

    import worker.artifacts as artifacts
    from apps.core.artifacts import artifact_key
    from apps.datasets.demo import generate_demo_dataset
    from apps.datasets.services import dataset_register

    root = settings.DATASETS_DIR / "_shared" / f"twice-{uuid.uuid4().hex[:8]}"
    localise = artifacts._localise_data_yaml

    def other_slot_lands_first(yaml_file, folder_key, local_folder):
        localise(yaml_file, folder_key, local_folder)
        shutil.copytree(yaml_file.parent, local_folder)  # the other slot's rename, just before this one's
        (local_folder / "other-slot").write_text("training from this copy")

    try:
        data_yaml = generate_demo_dataset(root, train=2, val=1, imgsz=32)
        dataset = dataset_register(team=teams["vision"], name="twice", yaml_path=data_yaml)
        settings.ARTIFACTS_CACHE_DIR = tmp_path / "node-cache"
        with override_settings(STORAGES=s3_storages(moto)):
            for path in sorted(root.rglob("*")):
                if path.is_file():
                    artifact_upload(artifact_key(path), path)
            monkeypatch.setattr(artifacts, "_localise_data_yaml", other_slot_lands_first)
            fetched = artifacts.dataset_local(dataset.yaml_key, dataset.sha256)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert fetched == cache_path(dataset.sha256, "dataset") / "data.yaml" and fetched.is_file()
    assert (fetched.parent / "other-slot").read_text() == "training from this copy"
    assert not [p for p in fetched.parent.parent.iterdir() if p.name.startswith(".fetch-")]
