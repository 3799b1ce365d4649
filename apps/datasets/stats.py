"""What the dataset page shows, and the hash jobs record: read from the stored files. No Django.

- :func:`manifest_sha256`: one hash for a dataset version's content — SHA-256 over the
  sorted lines ``<relative path>\\0<file sha256>\\n`` of every file (hidden ones and
  Ultralytics' caches skipped: :func:`training_byproduct`) — so two uploads with the same
  files have the same hash, whatever the zip looked like, and training on a dataset in
  place does not change it.
- :func:`dataset_stats`: images, label files and instances per split, the class
  histogram per split, and a few sample images with their boxes (normalised
  ``[class, cx, cy, w, h]``; a polygon or keypoint label is reduced to its box).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from apps.core.hashing import file_sha256

from .archive import IMAGE_SUFFIXES

SAMPLES = 6
MAX_SAMPLE_BOXES = 100


# What Ultralytics itself writes into a dataset folder when it trains on it in place (the
# shared DATA_DIR): label caches (``labels/train.cache``; ``train.cache`` beside a
# classification split) and, with ``cache=disk``, an ``.npy`` beside each image. They are
# not the dataset: uploads never contain them (archive.py refuses .cache, only images,
# labels and data.yaml pass), and a node fetching a dataset from object storage skips them
# (worker/artifacts.py: .cache files are unpickled by Ultralytics). Counting them made the
# hash depend on whether a job had trained on the folder before it was registered: the
# recorded hash then never matched the files a node fetched (CI, 12:3x, 46 requeues).
BYPRODUCT_SUFFIXES = (".cache", ".npy")


def training_byproduct(name: str) -> bool:
    """Whether the file (a name or path) is a cache Ultralytics writes, not part of the dataset."""
    return str(name).lower().endswith(BYPRODUCT_SUFFIXES)


def _files(folder: Path) -> list[Path]:
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found.extend(Path(root) / f for f in sorted(files) if not f.startswith(".") and not training_byproduct(f))
    return found


def manifest_sha256(folder: Path) -> tuple[str, int, int]:
    """(hash of the manifest, total bytes, file count) of every non-hidden file under ``folder``."""
    digest = hashlib.sha256()
    total = count = 0
    for path in sorted(_files(folder), key=lambda p: p.relative_to(folder).as_posix()):
        digest.update(f"{path.relative_to(folder).as_posix()}\0{file_sha256(path)}\n".encode())
        total += path.stat().st_size
        count += 1
    return digest.hexdigest(), total, count


def label_path(image: Path) -> Path:
    """Ultralytics' rule (``img2label_paths``): the last ``images`` folder becomes ``labels``, suffix ``.txt``."""
    parts = list(image.parts)
    for index in range(len(parts) - 2, -1, -1):
        if parts[index] == "images":
            parts[index] = "labels"
            break
    return Path(*parts).with_suffix(".txt")


def label_boxes(text: str) -> list[list[float]]:
    """Boxes ``[class, cx, cy, w, h]`` of a YOLO label file (boxes, polygons or keypoints)."""
    boxes = []
    for line in text.splitlines():
        words = line.split()
        if len(words) < 5:
            continue
        try:
            cls, values = int(words[0]), [float(w) for w in words[1:]]
        except ValueError:
            continue
        if len(values) > 4 and len(values) % 2 == 0:  # a polygon: x1 y1 x2 y2 …
            xs, ys = values[0::2], values[1::2]
            x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
            boxes.append([cls, (x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0])
        else:  # a box, or a box followed by keypoints
            boxes.append([cls, *values[:4]])
    return boxes


def _images(folder: Path) -> list[Path]:
    return [p for p in _files(folder) if p.suffix.lower() in IMAGE_SUFFIXES] if folder.is_dir() else []


def dataset_stats(root: Path, *, names: list[str], splits: dict[str, str]) -> dict[str, Any]:
    """Counts, histogram and samples of a YOLO dataset (``splits``: split → images folder, relative)."""
    stats: dict[str, Any] = {"splits": {}, "histogram": {}, "samples": []}
    sample_pool: list[tuple[str, Path]] = []
    for split, relative in splits.items():
        images = _images(root / relative)
        histogram = [0] * len(names)
        labelled = instances = 0
        for image in images:
            label = label_path(image)
            if not label.is_file():
                continue
            labelled += 1
            for box in label_boxes(label.read_text(encoding="utf-8", errors="replace")):
                instances += 1
                if 0 <= box[0] < len(names):
                    histogram[box[0]] += 1
        stats["splits"][split] = {"images": len(images), "labels": labelled, "instances": instances}
        stats["histogram"][split] = histogram
        if split == "val" or not sample_pool:
            sample_pool = [(split, image) for image in images]
    stats["samples"] = [_sample(root, split, image) for split, image in _spread(sample_pool, SAMPLES)]
    return stats


def images_stats(root: Path) -> dict[str, Any]:
    """An images-only upload (to predict on): the count and a few samples without boxes."""
    images = _images(root)
    return {"splits": {"images": {"images": len(images), "labels": 0, "instances": 0}}, "histogram": {},
            "samples": [{"split": "images", "image": image.relative_to(root).as_posix(), "boxes": []}
                        for image in _spread_paths(images, SAMPLES)]}


def _sample(root: Path, split: str, image: Path) -> dict[str, Any]:
    label = label_path(image)
    boxes = label_boxes(label.read_text(encoding="utf-8", errors="replace")) if label.is_file() else []
    return {"split": split, "image": image.relative_to(root).as_posix(),
            "boxes": [[box[0], *(round(v, 5) for v in box[1:])] for box in boxes[:MAX_SAMPLE_BOXES]]}


def _spread(items: list, count: int) -> list:
    """``count`` items spread evenly over the list (deterministic)."""
    if len(items) <= count:
        return list(items)
    step = len(items) / count
    return [items[int(i * step)] for i in range(count)]


def _spread_paths(items: list[Path], count: int) -> list[Path]:
    return _spread(items, count)
