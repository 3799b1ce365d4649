"""A small synthetic YOLO detection dataset: coloured shapes on noisy backgrounds.

Used by the demo, the tests and `make run` on machines that have no real data and no
internet. Pure Python (numpy + PIL, both already ultralytics dependencies); no Django.

Layout written under ``root``::

    root/data.yaml            path (absolute), train, val, names; never a `download:` key
    root/demo.json            the parameters that produced the dataset (the "complete" marker)
    root/images/{train,val}/  JPEG images
    root/labels/{train,val}/  one ``class cx cy w h`` line per shape, normalised to [0, 1]

The dataset is built in a sibling temporary directory and renamed into place, so a
crash part-way never leaves a ``root`` that looks complete.

The folder uploads as it is (``yoloq dataset push root``): the upload drops data.yaml's ``path``
and skips ``demo.json`` beside it, naming both in its ``skipped`` answer.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import yaml
from PIL import Image, ImageDraw

CLASS_NAMES: dict[int, str] = {0: "rectangle", 1: "circle", 2: "triangle"}
GENERATOR = "yoloportal-demo-shapes"
GENERATOR_VERSION = 1  # bump when the drawing changes, so old datasets are rebuilt

_MARKER = "demo.json"


def generate_demo_dataset(root: Path, *, train: int = 32, val: int = 8, imgsz: int = 128, seed: int = 0) -> Path:
    """Write the demo dataset into ``root`` (if needed) and return ``root/data.yaml``.

    Deterministic for given parameters; a second call with the same parameters returns
    at once. A ``root`` holding a demo dataset built with other parameters is replaced;
    a non-empty ``root`` that is not a demo dataset is refused (FileExistsError).
    """
    if train < 1 or val < 1:
        raise ValueError("train and val must each be at least 1")
    if imgsz < 32:
        raise ValueError("imgsz must be at least 32")
    root = Path(root).expanduser().resolve()
    params = {
        "generator": GENERATOR,
        "version": GENERATOR_VERSION,
        "train": train,
        "val": val,
        "imgsz": imgsz,
        "seed": seed,
    }
    if _is_complete(root, params):
        return root / "data.yaml"
    if root.exists() and not _is_demo_dataset(root) and any(root.iterdir()):
        raise FileExistsError(f"{root} exists and is not a demo dataset; refusing to replace it")

    root.parent.mkdir(parents=True, exist_ok=True)
    # Same parent directory as root, so the final rename is atomic (same filesystem).
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.tmp-", dir=root.parent))
    staging.chmod(0o755)  # mkdtemp makes 0700; the dataset is read by other processes
    try:
        _write_dataset(staging, final_root=root, params=params, train=train, val=val, imgsz=imgsz, seed=seed)
        _move_into_place(staging, root, params)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # no-op once renamed away
    return root / "data.yaml"


def _is_demo_dataset(root: Path) -> bool:
    try:
        return json.loads((root / _MARKER).read_text()).get("generator") == GENERATOR
    except (OSError, ValueError, AttributeError):
        return False


def _is_complete(root: Path, params: dict[str, object]) -> bool:
    """True when root holds a finished dataset made with these parameters at this path."""
    try:
        marker = json.loads((root / _MARKER).read_text())
        data = yaml.safe_load((root / "data.yaml").read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return False
    # `path` is absolute: a dataset copied or moved elsewhere must be rewritten.
    return marker == params and isinstance(data, dict) and data.get("path") == str(root)


def _move_into_place(staging: Path, root: Path, params: dict[str, object]) -> None:
    try:
        # rename(2) replaces a missing or empty directory atomically.
        os.rename(staging, root)
    except OSError:
        if _is_complete(root, params):
            return  # a concurrent call finished first; its result is identical
        # An older demo dataset with other parameters: swap it out, then drop it.
        retired = Path(tempfile.mkdtemp(prefix=f".{root.name}.old-", dir=root.parent))
        os.rename(root, retired / "dataset")
        try:
            os.rename(staging, root)
        finally:
            shutil.rmtree(retired, ignore_errors=True)
    _fsync_dir(root.parent)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # not every filesystem lets a directory be fsynced
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_dataset(
    staging: Path, *, final_root: Path, params: dict[str, object], train: int, val: int, imgsz: int, seed: int
) -> None:
    # One child generator per split, so changing `val` does not change the train images.
    train_rng, val_rng = np.random.default_rng(seed).spawn(2)
    for split, count, rng in (("train", train, train_rng), ("val", val, val_rng)):
        images, labels = staging / "images" / split, staging / "labels" / split
        images.mkdir(parents=True)
        labels.mkdir(parents=True)
        for index in range(count):
            image, boxes = _draw_image(rng, imgsz)
            stem = f"{split}_{index:05d}"
            image.save(images / f"{stem}.jpg", quality=92)
            (labels / f"{stem}.txt").write_text(
                "".join(f"{c} {x:.6f} {y:.6f} {w:.6f} {h:.6f}\n" for c, x, y, w, h in boxes)
            )

    data = {
        "path": str(final_root),
        "train": "images/train",
        "val": "images/val",
        "names": dict(CLASS_NAMES),
    }
    (staging / "data.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    # The marker is written last: its presence with matching parameters means "complete".
    (staging / _MARKER).write_text(json.dumps(params, sort_keys=True))


Box = tuple[int, float, float, float, float]


def _draw_image(rng: np.random.Generator, imgsz: int) -> tuple[Image.Image, list[Box]]:
    """One image with 1-3 shapes, and its YOLO boxes (class, cx, cy, w, h normalised)."""
    image = Image.fromarray(_background(rng, imgsz))
    draw = ImageDraw.Draw(image)
    boxes: list[Box] = []
    for _ in range(int(rng.integers(1, 4))):
        cls = int(rng.integers(0, len(CLASS_NAMES)))
        size = int(rng.integers(imgsz // 6, imgsz // 2))
        x0 = int(rng.integers(0, imgsz - size))
        y0 = int(rng.integers(0, imgsz - size))
        x1, y1 = x0 + size, y0 + size
        # Saturated colours keep the shapes visible against the muted backgrounds.
        colour = rng.integers(0, 176, size=3)
        colour[int(rng.integers(0, 3))] += 80
        fill = tuple(int(v) for v in colour)
        if cls == 0:
            aspect = float(rng.uniform(0.5, 1.0))
            if rng.random() < 0.5:
                y1 = y0 + max(4, int(size * aspect))
            else:
                x1 = x0 + max(4, int(size * aspect))
            draw.rectangle((x0, y0, x1, y1), fill=fill)
        elif cls == 1:
            draw.ellipse((x0, y0, x1, y1), fill=fill)
        else:
            apex_x = x0 + int(rng.integers(0, size + 1))
            draw.polygon([(apex_x, y0), (x0, y1), (x1, y1)], fill=fill)
        # PIL fills inclusive pixel bounds, so the box spans x0..x1 (size + 1 pixels).
        w, h = x1 - x0 + 1, y1 - y0 + 1
        boxes.append((cls, (x0 + w / 2) / imgsz, (y0 + h / 2) / imgsz, w / imgsz, h / imgsz))
    return image, boxes


def _background(rng: np.random.Generator, imgsz: int) -> np.ndarray:
    """A linear gradient between two random colours, plus Gaussian noise."""
    start = rng.integers(0, 200, size=3).astype(np.float32)
    end = rng.integers(0, 200, size=3).astype(np.float32)
    angle = float(rng.uniform(0, 2 * np.pi))
    ys, xs = np.mgrid[0:imgsz, 0:imgsz].astype(np.float32) / max(imgsz - 1, 1)
    t = np.clip((xs * np.cos(angle) + ys * np.sin(angle) + 1) / 2, 0, 1)[..., None]
    image = start * (1 - t) + end * t
    image += rng.normal(0, 12, size=image.shape).astype(np.float32)
    return np.clip(image, 0, 255).astype(np.uint8)


def generate_demo_classification_dataset(root: Path, *, train: int = 8, val: int = 2, imgsz: int = 32,
                                         seed: int = 0) -> Path:
    """Write a classification dataset in Ultralytics' layout into the empty (or missing) ``root`` and
    return it: ``root/{train,val}/<class>/<n>.png``, ``train`` and ``val`` images per class of
    :data:`CLASS_NAMES`, each one shape of its class on a noisy background. Deterministic.

    Zipped (or pushed as a folder) it is what a classification upload looks like; the tests train
    on it. A non-empty ``root`` is refused (FileExistsError).
    """
    if train < 1 or val < 1:
        raise ValueError("train and val must each be at least 1 image per class")
    if imgsz < 10:
        raise ValueError("imgsz must be at least 10 (training skips smaller images)")
    root = Path(root).expanduser().resolve()
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(f"{root} exists and is not empty; refusing to write into it")
    train_rng, val_rng = np.random.default_rng(seed).spawn(2)
    for split, count, rng in (("train", train, train_rng), ("val", val, val_rng)):
        for cls, name in CLASS_NAMES.items():
            folder = root / split / name
            folder.mkdir(parents=True)
            for index in range(count):
                _draw_one_shape(rng, imgsz, cls).save(folder / f"{index:04d}.png")
    return root


def _draw_one_shape(rng: np.random.Generator, imgsz: int, cls: int) -> Image.Image:
    """One shape of class ``cls`` (rectangle, circle, triangle), large and centred enough to tell apart."""
    image = Image.fromarray(_background(rng, imgsz))
    draw = ImageDraw.Draw(image)
    size = int(rng.integers(imgsz // 2, imgsz - 2))
    x0, y0 = int(rng.integers(0, imgsz - size)), int(rng.integers(0, imgsz - size))
    x1, y1 = x0 + size, y0 + size
    colour = rng.integers(0, 176, size=3)
    colour[int(rng.integers(0, 3))] += 80
    fill = tuple(int(v) for v in colour)
    if cls == 0:
        draw.rectangle((x0, y0, x1, y1), fill=fill)
    elif cls == 1:
        draw.ellipse((x0, y0, x1, y1), fill=fill)
    else:
        draw.polygon([(x0 + size // 2, y0), (x0, y1), (x1, y1)], fill=fill)
    return image
