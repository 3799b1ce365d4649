"""A dataset version's hash (apps.datasets.stats.manifest_sha256) is its content only: what
Ultralytics writes into the folder when it trains there in place does not change it."""

from __future__ import annotations

from apps.datasets.demo import generate_demo_dataset
from apps.datasets.stats import manifest_sha256, training_byproduct


def test_training_in_place_does_not_change_a_datasets_hash(tmp_path):
    root = generate_demo_dataset(tmp_path / "demo", train=2, val=1, imgsz=32).parent
    before = manifest_sha256(root)
    # What a job leaves there: pickled label caches, and .npy images with cache=disk.
    (root / "labels" / "train.cache").write_bytes(b"\x80\x04 a pickled label cache")
    (root / "labels" / "val.cache").write_bytes(b"\x80\x04 another")
    image = sorted((root / "images" / "train").iterdir())[0]
    image.with_suffix(".npy").write_bytes(b"\x93NUMPY an image")
    assert manifest_sha256(root) == before
    # A real change still changes it.
    label = sorted((root / "labels" / "train").iterdir())[0]
    label.write_text(label.read_text() + "0 0.5 0.5 0.1 0.1\n")
    assert manifest_sha256(root)[0] != before[0]


def test_only_ultralytics_caches_are_byproducts():
    assert training_byproduct("datasets/t/d/v1/labels/train.cache")
    assert training_byproduct("images/train/0001.NPY")
    assert not training_byproduct("labels/train/0001.txt")
    assert not training_byproduct("images/train/cache.jpg")
    assert not training_byproduct("data.yaml")
