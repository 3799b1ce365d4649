"""Build small YOLO dataset zips (valid and hostile) in memory."""

from __future__ import annotations

import functools
import io
import stat
import zipfile

from django.core.files.uploadedfile import SimpleUploadedFile

DATA_YAML = "train: images/train\nval: images/val\nnames: {0: scratch, 1: dent}\n"
# A 1×1 PNG is enough: the archive checks never decode images.
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
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
