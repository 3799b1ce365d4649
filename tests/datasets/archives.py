"""Build small YOLO dataset zips (valid and hostile) in memory."""

from __future__ import annotations

import functools
import io
import stat
import zipfile

from django.core.files.uploadedfile import SimpleUploadedFile

DATA_YAML = "train: images/train\nval: images/val\nnames: {0: scratch, 1: dent}\n"
# A 10×10 PNG is enough: the archive checks read image headers, never decode them. (Ultralytics
# skips images under 10 pixels a side as corrupt, so the upload refuses those: TINY_PNG.)
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d494844520000000a0000000a08060000008d32cfbd"
    "0000000e4944415478da6360180583130000019a000100ea18de0000000049454e44ae426082"
)


def valid_files(prefix: str = "") -> dict[str, bytes]:
    files = {"data.yaml": DATA_YAML.encode()}
    for split in ("train", "val"):
        for n in range(2):
            files[f"images/{split}/{n}.png"] = PNG
            files[f"labels/{split}/{n}.txt"] = b"0 0.5 0.5 0.2 0.2\n1 0.1 0.1 0.05 0.05\n"
    return {prefix + name: data for name, data in files.items()}


def make_zip(files: dict[str, bytes], *, symlinks: dict[str, str] | None = None,
             compression: int = zipfile.ZIP_DEFLATED, special: dict[str, int] | None = None) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=compression) as archive:
        for name, data in files.items():
            info = zipfile.ZipInfo(name)
            info.compress_type = compression
            info.external_attr = (stat.S_IFREG | 0o644) << 16
            archive.writestr(info, data)
        for name, target in (symlinks or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, target)
        for name, mode in (special or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = mode << 16
            archive.writestr(info, b"")
    return buffer.getvalue()


@functools.lru_cache(maxsize=2)
def zip_bomb(size: int = 64 * 1024**2) -> bytes:
    """One member of zeros that deflates ~1000:1 (64 MiB → ~64 KiB); written in chunks."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("data.yaml", DATA_YAML)
        with archive.open("images/train/0.png", "w", force_zip64=True) as member:
            chunk = b"\0" * (1024**2)
            for _ in range(size // len(chunk)):
                member.write(chunk)
    return buffer.getvalue()


def upload(content: bytes, name: str = "dataset.zip") -> SimpleUploadedFile:
    return SimpleUploadedFile(name, content, content_type="application/zip")


def jpeg(size: tuple[int, int] = (32, 24), color: tuple[int, int, int] = (200, 40, 40)) -> bytes:
    """A real, decodable JPEG (what a camera or an export tool writes)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="JPEG")
    return buffer.getvalue()


ROBOFLOW_YAML = """train: ../train/images
val: ../valid/images
test: ../test/images

nc: 2
names: ['widget', 'gadget']

roboflow:
  workspace: acme
  project: widgets
  version: 3
  license: CC BY 4.0
  url: https://universe.roboflow.com/acme/widgets/dataset/3
"""


def roboflow_files(counts: dict[str, int] | None = None) -> dict[str, bytes]:
    """A YOLO export as Roboflow writes it: <split>/images and <split>/labels beside data.yaml,
    whose splits say ``../<split>/images``, and two README .txt files at the top."""
    files = {"data.yaml": ROBOFLOW_YAML.encode(),
             "README.roboflow.txt": b"\nWidgets - v3 2026-12-01\n==============================\n\nThis dataset "
                                    b"was exported via roboflow.com on December 1, 2026\n",
             "README.dataset.txt": b"# Widgets > 2026-12-01\nhttps://universe.roboflow.com/acme/widgets\n\n"
                                   b"Provided by a Roboflow user\nLicense: CC BY 4.0\n"}
    for split, count in (counts or {"train": 5, "valid": 3, "test": 2}).items():
        for n in range(count):
            stem = f"img{n:03d}_jpg.rf.{n:032x}"
            files[f"{split}/images/{stem}.jpg"] = jpeg(color=(40 * n % 255, 120, 200))
            files[f"{split}/labels/{stem}.txt"] = f"{n % 2} 0.5 0.5 0.25 0.3\n1 0.2 0.3 0.1 0.1\n".encode()
    return files
