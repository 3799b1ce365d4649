"""What the dataset page shows, and the hash jobs record: read from the stored files. No Django.

- :func:`manifest_sha256`: one hash for a dataset version's content — SHA-256 over the
  sorted lines ``<relative path>\\0<file sha256>\\n`` of every file (hidden ones and
  Ultralytics' caches skipped: :func:`training_byproduct`) — so two uploads with the same
  files have the same hash, whatever the zip looked like, and training on a dataset in
  place does not change it.
- :func:`dataset_stats`: images, label files and instances per split, the class
  histogram per split, a few sample images with their boxes (normalised
  ``[class, cx, cy, w, h]``; a polygon or keypoint label is reduced to its box), and
  what kind of labels the files hold (``labels``: :func:`label_format`), which decides
  the tasks a job may train or validate on it (:func:`label_task_problem`).
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


def label_lines(text: str, *, keypoint_values: int = 0) -> list[tuple[str, list[float]]]:
    """Each line of a YOLO label file as (shape, box): shape ``boxes``, ``polygons`` or ``keypoints``,
    box ``[class, cx, cy, w, h]``.

    A line is ``class`` and then 4 values (a box), an even number of points' coordinates
    (a polygon: segment or obb labels), or a box followed by keypoints: ``keypoint_values``
    of them when data.yaml gives ``kpt_shape`` [k, d] (k·d), else an odd count (a visibility
    flag per point) is the only reading left.
    """
    lines = []
    for line in text.splitlines():
        words = line.split()
        if len(words) < 5:
            continue
        try:
            cls, values = int(words[0]), [float(w) for w in words[1:]]
        except ValueError:
            continue
        keypoints = len(values) > 4 and (len(values) == 4 + keypoint_values if keypoint_values
                                         else len(values) % 2 == 1)
        if len(values) > 4 and not keypoints:  # a polygon: x1 y1 x2 y2 …
            xs, ys = values[0::2], values[1::2]
            x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
            lines.append(("polygons", [cls, (x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0]))
        else:  # a box, or a box followed by keypoints
            lines.append(("keypoints" if keypoints else "boxes", [cls, *values[:4]]))
    return lines


def label_boxes(text: str) -> list[list[float]]:
    """Boxes ``[class, cx, cy, w, h]`` of a YOLO label file (boxes, polygons or keypoints)."""
    return [box for _, box in label_lines(text)]


LABEL_SHAPES = ("boxes", "polygons", "keypoints")
# What each task reads from a label line, as Ultralytics trains and validates it: a detect job
# takes the box of a polygon too; segment and obb need every object outlined (with boxes
# beside polygons Ultralytics drops the polygons and the loss fails); pose needs keypoints
# and ``kpt_shape``. Classify reads a folder per class, which a YOLO dataset never is.
TASK_SHAPES = {"detect": {"boxes", "polygons"}, "segment": {"polygons"}, "obb": {"polygons"},
               "pose": {"keypoints"}, "classify": set()}
TASK_NEEDS = {"detect": "box or polygon labels", "segment": "a polygon outline for every object",
              "obb": "a polygon (the four corners of a rotated box) for every object",
              "pose": "keypoint labels and kpt_shape in its data.yaml",
              "classify": "a classification dataset (a folder of images per class), not YOLO labels"}
SHAPE_WORDS = {"boxes": "boxes (detection labels)", "polygons": "polygons (segmentation or obb labels)",
               "keypoints": "keypoints (pose labels)"}


def label_format(shapes: set[str]) -> str:
    """The kind of labels a dataset holds: ``boxes``, ``polygons``, ``keypoints``, several joined
    by ``+`` (``boxes+polygons``), or '' when no file holds a label."""
    return "+".join(shape for shape in LABEL_SHAPES if shape in shapes)


def label_task_problem(labels: str, task: str, *, kpt_shape: bool = False) -> str:
    """Why a ``task`` job cannot use a YOLO dataset whose labels are ``labels`` (:func:`label_format`)
    and whose data.yaml has ``kpt_shape`` or not; '' when it can, or when what the dataset holds
    is not known (``labels`` '': a row stored before it was recorded, or no labels at all)."""
    if task == "classify":
        return f"is a YOLO dataset (data.yaml, images and labels); classify jobs need {TASK_NEEDS[task]}"
    needed = TASK_SHAPES.get(task)
    shapes = {shape for shape in labels.split("+") if shape}
    if needed is None or not shapes:
        return ""
    held = " and ".join(SHAPE_WORDS.get(shape, shape) for shape in LABEL_SHAPES if shape in shapes)
    if not shapes <= needed:
        return f"holds {held}; {task} jobs need {TASK_NEEDS[task]}"
    if task == "pose" and not kpt_shape:
        return f"holds {held} but its data.yaml has no kpt_shape; pose jobs need {TASK_NEEDS[task]}"
    return ""


def classification_task_problem(task: str) -> str:
    """Why a ``task`` job other than classify cannot use a classification dataset."""
    return (f"is a classification dataset (a folder of images per class, no labels); {task} jobs need "
            f"{TASK_NEEDS.get(task, 'a YOLO dataset')}: train a -cls model (e.g. yolov8n-cls.yaml) on it")


def _images(folder: Path) -> list[Path]:
    return [p for p in _files(folder) if p.suffix.lower() in IMAGE_SUFFIXES] if folder.is_dir() else []


def dataset_stats(root: Path, *, names: list[str], splits: dict[str, str],
                  kpt_shape: list[int] | None = None) -> dict[str, Any]:
    """Counts, histogram, samples and label kind of a YOLO dataset (``splits``: split → images
    folder, relative; ``kpt_shape``: data.yaml's, for a pose dataset)."""
    stats: dict[str, Any] = {"splits": {}, "histogram": {}, "samples": []}
    sample_pool: list[tuple[str, Path]] = []
    shapes: set[str] = set()
    keypoint_values = kpt_shape[0] * kpt_shape[1] if kpt_shape else 0
    for split, relative in splits.items():
        images = _images(root / relative)
        histogram = [0] * len(names)
        labelled = instances = 0
        for image in images:
            label = label_path(image)
            if not label.is_file():
                continue
            labelled += 1
            for shape, box in label_lines(label.read_text(encoding="utf-8", errors="replace"),
                                          keypoint_values=keypoint_values):
                shapes.add(shape)
                instances += 1
                if 0 <= box[0] < len(names):
                    histogram[box[0]] += 1
        stats["splits"][split] = {"images": len(images), "labels": labelled, "instances": instances}
        stats["histogram"][split] = histogram
        if split == "val" or not sample_pool:
            sample_pool = [(split, image) for image in images]
    stats["samples"] = [_sample(root, split, image) for split, image in _spread(sample_pool, SAMPLES)]
    stats["labels"] = label_format(shapes)
    if kpt_shape:
        stats["kpt_shape"] = list(kpt_shape)
    return stats


def classification_stats(root: Path, *, names: list[str], splits: dict[str, str]) -> dict[str, Any]:
    """Counts, per-class histogram and samples of a classification dataset (``splits``: split → its
    folder, holding a folder per class). Each image is one instance of its folder's class; a
    sample's ``boxes`` is empty and ``class`` names its class id."""
    stats: dict[str, Any] = {"splits": {}, "histogram": {}, "samples": [], "labels": "classes"}
    sample_pool: list[tuple[str, Path, int]] = []
    for split, folder in splits.items():
        histogram, pool = [], []
        for number, name in enumerate(names):
            images = sorted(_images(root / folder / name))
            histogram.append(len(images))
            pool += [(split, image, number) for image in images]
        stats["splits"][split] = {"images": len(pool), "labels": len(pool), "instances": len(pool)}
        stats["histogram"][split] = histogram
        if split == "val" or not sample_pool:
            sample_pool = pool
    stats["samples"] = [{"split": split, "image": image.relative_to(root).as_posix(), "boxes": [], "class": number}
                        for split, image, number in _spread(sample_pool, SAMPLES)]
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
