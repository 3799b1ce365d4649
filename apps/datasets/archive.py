"""Inspect an uploaded YOLO dataset zip **before** anything is extracted, then extract it safely.

:func:`archive_inspect` reads only the zip's central directory, the small text members
(``data.yaml``, label files) and the header of each image. It returns an :class:`ArchivePlan` or raises
:class:`ArchiveRejected` whose ``problems`` say, per archive member, what was wrong.

Checked, in this order, and all reported together where possible:

1. the upload's compressed size; that it is a zip at all;
2. member count, declared total uncompressed size, per-member and overall
   compression ratio (zip bombs), compression method (stored/deflated only:
   bzip2/lzma decompress without an output bound), encryption;
3. member names: no absolute paths, drive letters, backslashes, ``..`` (zip slip),
   control characters, duplicates; no symlinks or other special files;
4. member types: images, ``.txt`` labels and one ``data.yaml``; documentation beside
   data.yaml (README.md, LICENSE, *.pdf, *.html, *.json, a top-level *.txt) is skipped, not stored;
   Ultralytics' ``*.cache`` label caches (unpickled on load) are skipped, never stored; anything
   else is refused;
5. structure: ``data.yaml`` (strict safe YAML; ``download:`` and a ``path:`` other than ``.`` are
   dropped and named in ``skipped``, never run or followed; relative train/val
   folders present in the archive; a pose dataset's ``kpt_shape`` [k, d] and ``flip_idx``),
   images under ``images/`` with labels beside them under ``labels/``; every label line
   ``class x y w h`` (or a polygon/keypoints; with ``kpt_shape`` exactly the box and k·d
   keypoint values, as Ultralytics reads a pose label) with a known class id and normalised
   coordinates;
6. every image's header: a format and size Pillow reads, and in a YOLO dataset at least 10 pixels a
   side (Ultralytics' ``check_image`` skips the others as corrupt).

:func:`archive_extract` writes into a fresh folder with ``O_EXCL | O_NOFOLLOW``,
re-checks every target path, and stops a member that inflates past its declared size.
Pure Python: no Django.
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml
from PIL import Image, UnidentifiedImageError

from apps.core.strict_yaml import YamlError, load_yaml

# The image suffixes Ultralytics trains on (ultralytics.data.utils.IMG_FORMATS, which the web process
# does not import: it would load torch); tests/datasets/test_upload.py checks the two agree.
IMAGE_SUFFIXES = {".avif", ".bmp", ".dng", ".heic", ".heif", ".jp2", ".jpeg", ".jpg", ".mpo", ".png", ".tif", ".tiff",
                  ".webp"}
LABEL_SUFFIX = ".txt"
DATA_YAML_NAMES = {"data.yaml", "data.yml"}
MAX_CLASSES = 10000
# OS clutter that zip tools add; skipped (not extracted), never an error.
SKIPPED_PARTS = {"__MACOSX", ".DS_Store", "Thumbs.db", "desktop.ini"}
# Documentation people put beside a dataset (README.md, LICENSE, a paper as PDF, a Roboflow page saved
# as HTML): skipped, not stored, when it sits beside data.yaml (or at the archive's top, above a single
# top folder); inside the dataset's folders it is as unexpected as any other file. A top-level .txt
# (README.roboflow.txt) is documentation too: labels live in a 'labels' folder.
# A .json beside data.yaml is metadata (the demo generator's demo.json, an export tool's info): nothing
# reads it, so it is skipped the same way.
DOCUMENT_SUFFIXES = {".md", ".markdown", ".rst", ".pdf", ".html", ".htm", ".cff", ".json"}
DOCUMENT_NAMES = {"license", "licence", "copying", "notice", "readme", "authors"}  # files without a suffix
SPLIT_KEYS = ("train", "val", "test")
MAX_REPORTED_PROBLEMS = 50
# Ultralytics' check_image refuses images under 10 pixels a side ("image size … <10 pixels"): a
# training run would drop them as corrupt. Predict has no such floor, so images-only uploads keep 1.
TRAINING_MIN_SIDE = 10
# HEIC/HEIF (an iPhone's photos): Pillow reads them only with a plugin (pillow-heif) the nodes do not
# have, and Ultralytics would try to install pi-heif at training time, offline. Known by the suffix or,
# under another suffix, by the ISO-BMFF 'ftyp' box's major brand.
HEIC_SUFFIXES = {".heic", ".heif"}
HEIC_BRANDS = {b"heic", b"heix", b"hevc", b"hevx", b"heim", b"heis", b"hevm", b"hevs", b"mif1", b"msf1", b"heif"}
HEIC_PROBLEM = "is a HEIC/HEIF image (an iPhone's photo format), which training cannot read: convert it to JPEG or PNG"
HEIC_NAMED = 3


@dataclass(frozen=True)
class ArchiveLimits:
    max_compressed_bytes: int = 2 * 1024**3
    max_uncompressed_bytes: int = 20 * 1024**3
    max_files: int = 200_000
    max_member_bytes: int = 512 * 1024**2
    max_ratio: float = 100.0  # overall uncompressed/compressed
    max_member_ratio: float = 200.0  # for members over 64 KiB
    max_label_bytes: int = 1024**2
    max_yaml_bytes: int = 64 * 1024
    max_name_chars: int = 512
    max_depth: int = 16


@dataclass
class Problem:
    path: str
    problem: str

    def as_dict(self) -> dict[str, str]:
        return {"path": self.path, "problem": self.problem}


class ArchiveRejected(ValueError):
    """The archive cannot be accepted. ``summary`` is one line; ``problems`` lists each finding;
    ``field`` is the request field the summary is about (the archive, unless it is the name)."""

    def __init__(self, summary: str, problems: list[Problem] | None = None, *, field: str = "file"):
        self.summary = summary
        self.problems = problems or []
        self.field = field
        super().__init__(summary)

    def report(self) -> dict[str, Any]:
        return {
            self.field: [self.summary],
            "problems": [p.as_dict() for p in self.problems[:MAX_REPORTED_PROBLEMS]],
            "problem_count": len(self.problems),
        }


@dataclass
class ArchivePlan:
    """What to extract: member name in the zip → relative path in the dataset folder."""

    members: dict[str, str]
    directories: set[str]
    data_yaml: dict[str, Any]
    names: dict[int, str]
    splits: dict[str, str]  # split key → relative images folder
    num_images: int
    num_labels: int
    uncompressed_bytes: int
    skipped: list[str] = field(default_factory=list)  # every member not stored (documentation, OS clutter)
    documentation: list[str] = field(default_factory=list)  # the documentation among them
    kpt_shape: list[int] | None = None  # a pose dataset's [keypoints, values per keypoint]
    flip_idx: list[int] | None = None  # which keypoint each one becomes when the image is mirrored
    kpt_names: dict[int, list[str]] | None = None  # each class's keypoint names (Ultralytics keeps them in the model)
    kind: str = "yolo"  # "classify": Ultralytics' classification layout (splits map to the split folders)
    dropped_keys: list[str] = field(default_factory=list)  # data.yaml keys not kept ('download', 'path'), said why


# --- helpers ----------------------------------------------------------------------------------


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _name_problem(name: str, limits: ArchiveLimits) -> str | None:
    """Why this member name is unsafe, or None."""
    if len(name) > limits.max_name_chars:
        return f"name is longer than {limits.max_name_chars} characters"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "name contains control characters"
    if "\\" in name:
        return "name contains a backslash; use '/' between folders"
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        return "absolute path (would be written outside the dataset folder)"
    parts = [p for p in name.split("/") if p]
    if ".." in parts:
        return "path contains '..' (zip slip: would be written outside the dataset folder)"
    if len(parts) > limits.max_depth:
        return f"nested deeper than {limits.max_depth} folders"
    if any(len(p.encode()) > 255 for p in parts):
        return "a path component is longer than 255 bytes"
    return None


def _file_and_folder_problems(files: dict[str, zipfile.ZipInfo], directories: set[str]) -> list[Problem]:
    """A file whose name is also a folder of other entries (``a.txt`` and ``a.txt/b.txt``): both
    cannot be written, and extraction failed on it (a 500: trial28 F1)."""
    inside: dict[str, str] = {}  # folder → one entry in it
    for name in [*files, *directories]:
        parts = name.split("/")
        for depth in range(1, len(parts)):
            inside.setdefault("/".join(parts[:depth]), name)
    return [Problem(files[name].filename, f"is a file, but {inside[name]!r} is inside a folder of that name: "
                                          "a file and a folder cannot share a name")
            for name in files if name in inside]


def _oversized_text(info: zipfile.ZipInfo, limits: ArchiveLimits) -> bool:
    """A .txt declared over the label limit: whatever it is (a label, a misplaced one, a top-level
    document), nothing reads or extracts it (a label is refused by its size, the others by their place
    or skipped), so only its declared size matters, not its compression ratio.

    The suffix as the structure check matches a label file's, case and all: a labels/train/x.TXT is no
    label file there (not refused by the label limit) and is extracted; matched in any case here, it
    escaped the ratios too, 5 MiB of zeros from a few KiB (review32)."""
    return info.filename.endswith(LABEL_SUFFIX) and info.file_size > limits.max_label_bytes


def _normalize(name: str) -> str:
    """``./a//b/`` → ``a/b``; the archive root → ''."""
    normalized = posixpath.normpath(name)
    return "" if normalized == "." else normalized


def _member_kind(info: zipfile.ZipInfo) -> str:
    """'dir', 'file', 'symlink' or 'special' from the Unix mode bits (when present)."""
    mode = info.external_attr >> 16
    kind = stat.S_IFMT(mode)
    if kind == stat.S_IFLNK:
        return "symlink"
    if kind and kind not in (stat.S_IFREG, stat.S_IFDIR):
        return "special"
    if info.is_dir() or kind == stat.S_IFDIR:
        return "dir"
    return "file"


def _common_root(names: list[str]) -> str:
    """A single top folder every member lives in (``mydata/``), or ''."""
    tops = {n.split("/", 1)[0] for n in names}
    if len(tops) == 1 and all("/" in n for n in names):
        return tops.pop() + "/"
    return ""


def _document_type(name: str) -> bool:
    """README.md, LICENSE, a .pdf or .html: a document by its name, wherever it is."""
    base = posixpath.basename(name).lower()
    suffix = posixpath.splitext(base)[1]
    return suffix in DOCUMENT_SUFFIXES or (not suffix and base in DOCUMENT_NAMES)


def _documentation(files: list[str], directories: set[str]) -> tuple[str, list[str], list[str]]:
    """(the dataset's top folder, the documents beside data.yaml, documents misplaced inside it).

    The top folder is the single folder around everything else, so a README.md beside that
    folder does not make it a folder of the dataset. A document (or a .txt) is beside data.yaml
    when it sits at the archive's top or directly in that folder.
    """
    documents = {n for n in files if _document_type(n) or ("/" not in n and n.lower().endswith(LABEL_SUFFIX))}
    prefix = _common_root([n for n in files if n not in documents] + [d + "/" for d in directories])
    beside, misplaced = [], []
    for name in sorted(set(files)):
        at_top = "/" not in name or (name.startswith(prefix) and "/" not in name[len(prefix):])
        if at_top and (name in documents or name.lower().endswith(LABEL_SUFFIX)):
            beside.append(name)
        elif name in documents:
            misplaced.append(name)
    return prefix, beside, misplaced


def skipped_summary(plan: ArchivePlan) -> list[str]:
    """What the upload left out, for its answer: data.yaml's ``download``/``path`` keys, each document
    by name, then the OS clutter, a ``__MACOSX/`` folder as one line (it holds an entry per file)."""
    clutter = [n for n in plan.skipped if n not in plan.documentation]
    macos = [n for n in clutter if "__MACOSX" in n.split("/")]
    lines = list(plan.dropped_keys) + list(plan.documentation)
    lines += sorted({n for n in clutter if n not in macos and not n.endswith("/")})
    if macos:
        lines.append(f"__MACOSX/ ({len(macos)} entr{'y' if len(macos) == 1 else 'ies'} of macOS metadata)")
    return lines[:MAX_REPORTED_PROBLEMS]


def class_id(key: Any) -> int | None:
    """A ``names`` key as a class id: an integer, or digits in a string (``"0": cat``), which
    Ultralytics' ``check_class_names`` turns into ints too; None for anything else."""
    if isinstance(key, int) and not isinstance(key, bool):
        return key if key >= 0 else None
    if isinstance(key, str) and re.fullmatch(r"[0-9]+", key.strip()):
        return int(key)
    return None


def _class_names(document: dict) -> dict[int, str] | str:
    names = document.get("names")
    if names is None:
        nc = document.get("nc")
        if nc is None:
            return "needs 'names' (a list or {id: name} mapping) or 'nc'"
        if not isinstance(nc, int) or isinstance(nc, bool) or not 0 < nc <= MAX_CLASSES:
            return f"'nc' must be a whole number of classes from 1 to {MAX_CLASSES}, got {nc!r}"
        return {i: f"class_{i}" for i in range(nc)}
    if isinstance(names, list):
        names = dict(enumerate(names))
    if not isinstance(names, dict) or not names:
        return "'names' must be a non-empty list or {id: name} mapping"
    if len(names) > MAX_CLASSES:
        return f"'names' has {len(names)} classes; the limit is {MAX_CLASSES}"
    out: dict[int, str] = {}
    for key, value in names.items():
        number = class_id(key)
        if number is None:
            return f"'names' has a non-integer class id {key!r}"
        if number in out:
            return f"'names' gives class id {number} twice ({key!r} is the second)"
        # "must be a short name" said neither what was wrong nor how short (new-user trial 27, F7).
        if not isinstance(value, (str, int, float)):
            return f"'names' entry {key} must be a class name (text), got {type(value).__name__} {str(value)[:40]!r}"
        if len(str(value)) > 200:
            return f"'names' entry {key} has {len(str(value))} characters; a class name has at most 200"
        if not str(value).strip():  # taken until new-user trial 27 (F10): a class no plot or prediction tells apart
            return f"'names' entry {key} is blank ({value!r}); a class name needs a character other than spaces"
        if control := next((c for c in str(value) if ord(c) < 32 or ord(c) == 127), None):
            # A NUL was stored in the version's row: a 500 on PostgreSQL (trial28 F4); the archive's own
            # names (a classification dataset's folders) are refused control characters the same way.
            return (f"'names' entry {key} holds a control character (U+{ord(control):04X}); a class name is one "
                    "line of printable text")
        out[number] = str(value)
    if sorted(out) != list(range(len(out))):
        return "'names' class ids must be 0, 1, 2, … without gaps"
    if "nc" in document and document["nc"] != len(out):
        return f"'nc' is {document['nc']!r} but 'names' has {len(out)} entries"
    return dict(sorted(out.items()))


def kpt_shape_problem(value: Any) -> str:
    """Why data.yaml's ``kpt_shape`` is not one Ultralytics trains a pose model on ('' when it is):
    [k, d], k keypoints of d values each (2: x y; 3: x y visibility)."""
    if (not isinstance(value, list) or len(value) != 2
            or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in value)):
        return f"must be [keypoints, values per keypoint] (two positive whole numbers, e.g. [17, 3]), got {value!r}"
    if value[1] not in (2, 3):
        return f"values per keypoint must be 2 (x y) or 3 (x y visibility), got {value[1]}"
    if value[0] > 1000:
        return f"{value[0]} keypoints is more than the 1000 accepted"
    return ""


def _keypoints(document: dict, yaml_name: str, problems: list[Problem]) -> tuple[list[int] | None, list[int] | None]:
    """data.yaml's (``kpt_shape``, ``flip_idx``), each None when absent; problems named per key."""
    kpt_shape, flip_idx = document.get("kpt_shape"), document.get("flip_idx")
    if kpt_shape is not None and (bad := kpt_shape_problem(kpt_shape)):
        problems.append(Problem(f"{yaml_name}: kpt_shape", bad))
        return None, None
    if flip_idx is None:
        return kpt_shape, None
    if kpt_shape is None:
        problems.append(Problem(f"{yaml_name}: flip_idx", "is given without kpt_shape (it maps pose keypoints)"))
        return None, None
    count = kpt_shape[0]
    if (not isinstance(flip_idx, list) or any(not isinstance(i, int) or isinstance(i, bool) for i in flip_idx)
            or sorted(flip_idx) != list(range(count))):
        problems.append(Problem(f"{yaml_name}: flip_idx", f"must list each keypoint 0…{count - 1} once, in the "
                                                          f"order they take when the image is mirrored; got "
                                                          f"{str(flip_idx)[:200]}"))
        return kpt_shape, None
    return kpt_shape, flip_idx


def _keypoint_names(document: dict, yaml_name: str, names: dict[int, str], kpt_shape: list[int] | None,
                    problems: list[Problem]) -> dict[int, list[str]] | None:
    """data.yaml's ``kpt_names``: for classes of ``names``, the name of each of the ``kpt_shape[0]``
    keypoints (Ultralytics stores them in the trained model and its exports). None when absent."""
    value = document.get("kpt_names")
    if value is None:
        return None
    where = f"{yaml_name}: kpt_names"
    if kpt_shape is None:
        problems.append(Problem(where, "is given without kpt_shape (it names pose keypoints)"))
        return None
    count = kpt_shape[0]
    shape = f"must map class ids to lists of {count} keypoint names, e.g. {{0: [nose, left_eye, …]}}"
    if not isinstance(value, dict) or not value:
        problems.append(Problem(where, f"{shape}; got {str(value)[:200]}"))
        return None
    kept: dict[int, list[str]] = {}
    for key, listed in value.items():
        if not isinstance(key, int) or isinstance(key, bool) or key not in names:
            problems.append(Problem(where, f"{key!r} is no class id of names ({', '.join(map(str, names)) or 'none'})"))
            return None
        if (not isinstance(listed, list) or len(listed) != count
                or not all(isinstance(name, str) and 0 < len(name) <= 100 for name in listed)):
            problems.append(Problem(where, f"class {key}: {shape}; got {str(listed)[:200]}"))
            return None
        kept[key] = listed
    return kept


MISPLACED_NAMED = 3  # misplaced images and label files named one by one; more are one line with a count


def _misplaced_problems(images: list[str], labels: list[str]) -> list[Problem]:
    """Images outside an 'images' folder and label files outside a 'labels' folder: each named when
    there are a few; otherwise one line with the count, a couple of examples and the layout expected.
    A flat layout (train/a.jpg beside train/a.txt) got one line per file: 42 for 42 files (trial31)."""
    if len(images) + len(labels) <= MISPLACED_NAMED:
        return ([Problem(rel, "images belong in an 'images' folder (e.g. images/train/)") for rel in images]
                + [Problem(rel, "label files belong in a 'labels' folder beside 'images'") for rel in labels])
    image_dirs = {posixpath.dirname(rel) for rel in images}
    label_dirs = {posixpath.dirname(rel) for rel in labels}
    folders = sorted(image_dirs | label_dirs)
    where = ", ".join(f"{d}/" if d else "(top)" for d in folders[:MISPLACED_NAMED])
    where += f" and {len(folders) - MISPLACED_NAMED} more folders" if len(folders) > MISPLACED_NAMED else ""
    example = images[0] if images else labels[0]
    stem, folder = posixpath.splitext(example)[0], posixpath.dirname(example)
    split = posixpath.basename(folder) or "train"
    examples = [example] + [rel for rel in labels if posixpath.splitext(rel)[0] == stem and rel != example]
    if len(examples) == 1 and len(images + labels) > 1:
        # From the other kind where there is one (an image's label file), else the next of its own: label
        # files alone took images[0] of none, an IndexError (review32).
        others = [rel for rel in ((labels if example in images else images) or images + labels) if rel != example]
        examples += others[:1]
    image_name = posixpath.basename(images[0] if images else f"{posixpath.basename(stem)}.jpg")
    layout = (f"put each image in images/<split>/ and its label file in labels/<split>/ (images/{split}/"
              f"{image_name}, labels/{split}/{posixpath.basename(stem)}{LABEL_SUFFIX})")
    count = len(images) + len(labels)
    if images and labels and label_dirs <= image_dirs:
        what = f"{count} images and label files are side by side"
    elif images and labels:
        what = f"{count} images and label files are outside 'images' and 'labels' folders"
    elif images:
        what = f"{count} images are outside an 'images' folder"
    else:
        what = f"{count} label files are outside a 'labels' folder"
    return [Problem(where, f"{what} (e.g. {', '.join(examples[:2])}): {layout}")]


def _label_problems(text: str, num_classes: int, kpt_shape: list[int] | None = None) -> str | None:
    """The first problem in a YOLO label file, or None (``kpt_shape``: a pose dataset's, from data.yaml)."""
    first_box = first_polygon = 0  # line numbers, for a file that mixes the two
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split()
        if not words:
            continue
        if not re.fullmatch(r"\d+", words[0]):
            return f"line {number}: class id must be a whole number, got {words[0][:20]!r}"
        if int(words[0]) >= num_classes:
            return f"line {number}: class id {words[0]} is not in data.yaml names (0…{num_classes - 1})"
        try:
            values = [float(w) for w in words[1:]]
        except ValueError:
            return f"line {number}: coordinates must be numbers"
        if len(values) < 4:
            return f"line {number}: expected 'class x_center y_center width height', got {len(words)} values"
        if kpt_shape:
            # Ultralytics reads every line of a pose dataset as the box and k·d keypoint values.
            points, per_point = kpt_shape
            if len(values) != 4 + points * per_point:
                return (f"line {number}: data.yaml kpt_shape {kpt_shape} means 'class x_center y_center width height' "
                        f"and {points}×{per_point} keypoint values ({4 + points * per_point} numbers after the "
                        f"class), got {len(values)}")
            # A visibility flag (0, 1, 2) follows each point's x y when d is 3.
            bounded = values[:4] + [v for i, v in enumerate(values[4:]) if i % per_point < 2]
        else:
            # Boxes (4) and polygons (even counts) are all normalised; keypoints with a
            # visibility flag (odd counts) have flags up to 2 after the box.
            bounded = values if len(values) % 2 == 0 else values[:4]
            if len(values) == 4:
                first_box = first_box or number
            elif len(values) % 2 == 0:
                first_polygon = first_polygon or number
        if any(not 0.0 <= v <= 1.0 for v in bounded) or any(v < 0 or v != v for v in values):
            return f"line {number}: coordinates must be normalised to 0…1"
    if first_box and first_polygon:
        # Ultralytics drops such a file as corrupt ("labels mix segment and detection rows"): its
        # image would leave training with only a warning in the log (new-user trial 20).
        return (f"line {first_box} is a box and line {first_polygon} a polygon: Ultralytics skips a label file "
                "that mixes them, so write every object of a file as a polygon or every one as a box")
    return None


# --- inspection -------------------------------------------------------------------------------


def archive_inspect(upload: IO[bytes], *, size: int, limits: ArchiveLimits, kind: str = "yolo") -> ArchivePlan:
    """Check the archive without extracting anything. Raises :class:`ArchiveRejected`.

    ``kind`` "yolo" is a YOLO dataset (data.yaml, images, labels), or Ultralytics' classification
    layout when the archive is one (no data.yaml, ``train/<class>/<image>``: the plan's ``kind``
    says "classify"); "classify" is that layout only; "images" is a set of images to predict on
    (images only, in any folders).
    """
    if size > limits.max_compressed_bytes:
        raise ArchiveRejected(f"is {_human(size)}; the upload limit is {_human(limits.max_compressed_bytes)}")
    if size == 0:
        raise ArchiveRejected("is empty")
    try:
        upload.seek(0)
        archive = zipfile.ZipFile(upload)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError) as exc:
        raise ArchiveRejected(f"is not a readable zip archive ({exc})") from None
    with archive:
        return _inspect_open(archive, size=size, limits=limits, upload_kind=kind)


def _inspect_open(archive: zipfile.ZipFile, *, size: int, limits: ArchiveLimits, upload_kind: str) -> ArchivePlan:
    infos = archive.infolist()
    if not infos:
        # It said "has no data.yaml at its top", as if only that were missing (trial25). (Folders
        # without files go on: a classification layout's empty class folders are named one by one.)
        raise ArchiveRejected("is a zip archive with nothing in it")
    if len(infos) > limits.max_files:
        raise ArchiveRejected(f"has {len(infos)} entries; the limit is {limits.max_files}")
    declared = sum(i.file_size for i in infos)
    if declared > limits.max_uncompressed_bytes:
        raise ArchiveRejected(
            f"would unpack to {_human(declared)}; the limit is {_human(limits.max_uncompressed_bytes)}")
    # A .txt over the label limit is refused by that limit and never read or extracted, so it does not
    # count towards the ratio: one line repeated 400,000 times (7 MiB, deflating ~1000:1) was answered
    # "zip bomb?" instead of "label file is 6.9 MiB; the limit is 1.0 MiB" (trial31).
    counted = declared - sum(i.file_size for i in infos if _oversized_text(i, limits))
    if counted > 1024**2 and counted / max(size, 1) > limits.max_ratio:
        raise ArchiveRejected(
            f"compression ratio {counted / max(size, 1):.0f}:1 is above {limits.max_ratio:.0f}:1 (zip bomb?)")

    problems: list[Problem] = []
    files: dict[str, zipfile.ZipInfo] = {}
    directories: set[str] = set()
    skipped: list[str] = []
    seen: set[str] = set()
    for info in infos:
        name = info.filename
        bad = _name_problem(name, limits)
        if bad:
            problems.append(Problem(name, bad))
            continue
        normalized = _normalize(name)
        kind = _member_kind(info)
        if kind == "symlink":
            problems.append(Problem(name, "is a symbolic link; links are not allowed"))
            continue
        if kind == "special":
            problems.append(Problem(name, "is a device, pipe or socket; only files and folders are allowed"))
            continue
        if not normalized:
            continue
        if normalized in seen:
            problems.append(Problem(name, "appears twice in the archive"))
            continue
        seen.add(normalized)
        if any(part in SKIPPED_PARTS or part.startswith("._") for part in normalized.split("/")):
            skipped.append(name)
            continue
        if kind != "dir" and normalized.lower().endswith(".cache"):
            # Ultralytics' label caches (labels/train.cache), left by a local training of the folder
            # that was zipped: Ultralytics unpickles them, so they are never stored, only skipped (as
            # `yoloq dataset push` leaves them out of a folder); the worker's training writes its own.
            skipped.append(name)
            continue
        if kind == "dir":
            directories.add(normalized)
            continue
        if info.flag_bits & 0x1:
            problems.append(Problem(name, "is encrypted; upload an unencrypted zip"))
            continue
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            problems.append(Problem(name, "uses a compression method other than stored/deflate"))
            continue
        if info.file_size > limits.max_member_bytes:
            problems.append(Problem(name, f"is {_human(info.file_size)}; one file may be at most "
                                          f"{_human(limits.max_member_bytes)}"))
            continue
        if (info.file_size > 64 * 1024 and info.file_size / max(info.compress_size, 1) > limits.max_member_ratio
                and not _oversized_text(info, limits)):
            problems.append(Problem(name, f"compression ratio {info.file_size / max(info.compress_size, 1):.0f}:1 "
                                          f"is above {limits.max_member_ratio:.0f}:1 (zip bomb?)"))
            continue
        suffix = posixpath.splitext(normalized)[1].lower()
        base = posixpath.basename(normalized)
        if upload_kind == "images" and suffix not in IMAGE_SUFFIXES:
            problems.append(Problem(name, f"unexpected file type {suffix or '(none)'}: an upload of images to "
                                          "predict on holds images only"))
            continue
        if (suffix not in IMAGE_SUFFIXES and suffix != LABEL_SUFFIX and base not in DATA_YAML_NAMES
                and not _document_type(normalized)):
            if suffix in (".yaml", ".yml"):
                why = ("only images, .txt label files and data.yaml are accepted; if this is the dataset's "
                       "YAML, name it data.yaml")
            else:
                why = "only images, .txt label files and data.yaml are accepted"
            problems.append(Problem(name, f"unexpected file type {suffix or '(none)'}: {why}"))
            continue
        files[normalized] = info
    problems.extend(_file_and_folder_problems(files, directories))
    documentation: list[str] = []
    if upload_kind == "images":
        prefix = _common_root(list(files) + [d + "/" for d in directories])
    else:
        prefix, documentation, misplaced = _documentation(list(files), directories)
        if prefix.rstrip("/") in CLASSIFY_SPLIT_FOLDERS and not any(prefix + n in files for n in DATA_YAML_NAMES):
            # A classification archive with a single split (train/ only) is that split, not a folder
            # around the dataset: kept, so the check can say which split is missing.
            prefix = ""
        for name in misplaced:
            problems.append(Problem(name, f"unexpected file type {posixpath.splitext(name)[1] or '(none)'}: only "
                                          "images, .txt label files and data.yaml are accepted here (documentation "
                                          "such as README.md or LICENSE is skipped only beside data.yaml)"))
        for name in documentation:
            del files[name]
        skipped.extend(documentation)
    if problems:
        raise ArchiveRejected(f"has {len(problems)} unsafe or unexpected entr{'y' if len(problems) == 1 else 'ies'}",
                              problems)

    members = {name: name[len(prefix):] for name in files}
    by_relative = {rel: files[name] for name, rel in members.items()}
    dirs = {d[len(prefix):] for d in directories if d.startswith(prefix) and len(d) > len(prefix)}
    if upload_kind == "images":
        if not members:
            raise ArchiveRejected("holds no images", [Problem("(archive)", "no image files found")])
        if unreadable := _image_problems(archive, by_relative):
            summary = (f"has {len(unreadable)} file{'s' if len(unreadable) > 1 else ''} that "
                       f"{'are' if len(unreadable) > 1 else 'is'} not a readable image")
            raise ArchiveRejected(_with_heic_note(summary, unreadable), unreadable)
        return ArchivePlan(members=members, directories=dirs, data_yaml={}, names={}, splits={},
                           num_images=len(members), num_labels=0, uncompressed_bytes=declared, skipped=skipped)
    if upload_kind == "classify" or _classification_layout(by_relative):
        plan = _check_classification(archive, by_relative, dirs, limits)
    else:
        documents = {name[len(prefix):] for name in documentation}
        plan = _check_structure(archive, by_relative, members, dirs, skipped, declared, limits, documents)
    plan.members, plan.directories, plan.uncompressed_bytes = members, dirs, declared
    plan.skipped, plan.documentation = skipped, documentation
    return plan


# --- classification datasets ------------------------------------------------------------------

# Ultralytics' classify layout (check_cls_dataset): <split>/<class>/<image>, the classes being the
# folder names of train/; it validates on val/ (or valid/, validation/, as a Roboflow export names it).
CLASSIFY_SPLIT_FOLDERS = {"train": "train", "val": "val", "valid": "val", "validation": "val", "test": "test"}
CLASSIFY_LAYOUT = ("a classification dataset holds train/ and val/ (optionally test/), each with one folder of "
                   "images per class (train/cat/001.jpg); the class names are the folder names")


def _classification_layout(by_relative: dict[str, zipfile.ZipInfo]) -> bool:
    """An upload of the default kind that is Ultralytics' classify layout rather than a YOLO dataset:
    no data.yaml, only images, each inside a split folder (train/, val/, …). Checked in full by
    :func:`_check_classification`, which names what is out of place."""
    # train/images/… is a YOLO export without its data.yaml and labels, not a class called "images".
    return (bool(by_relative) and not any(rel in DATA_YAML_NAMES for rel in by_relative)
            and all(posixpath.splitext(rel)[1].lower() in IMAGE_SUFFIXES
                    and rel.split("/", 1)[0] in CLASSIFY_SPLIT_FOLDERS and "/" in rel
                    and rel.split("/")[1] not in ("images", "labels") for rel in by_relative))


def _check_classification(archive: zipfile.ZipFile, by_relative: dict[str, zipfile.ZipInfo], dirs: set[str],
                          limits: ArchiveLimits) -> ArchivePlan:
    """Check a classification dataset (``<split>/<class>/<image>``); ArchiveRejected names each problem.

    Each split's class folders must be train/'s: Ultralytics numbers the classes of every split
    from that split's own folders (torchvision's ImageFolder), so a class missing from val/ would
    shift the ids after it and validation would score the wrong labels without a word.
    """
    problems: list[Problem] = []
    folder_of: dict[str, str] = {}  # split → its folder (val may be 'valid')
    tops = sorted({rel.split("/", 1)[0] for rel in by_relative if "/" in rel} | {d.split("/", 1)[0] for d in dirs})
    for top in tops:
        split = CLASSIFY_SPLIT_FOLDERS.get(top)
        if split is None:
            problems.append(Problem(f"{top}/", f"is not a split folder: {CLASSIFY_LAYOUT}"))
        elif split in folder_of:
            problems.append(Problem(f"{top}/", f"is a second {split} folder beside {folder_of[split]}/: keep one"))
        else:
            folder_of[split] = top
    split_of = {folder: split for split, folder in folder_of.items()}
    counts: dict[str, dict[str, int]] = {split: {} for split in folder_of}
    for directory in dirs:
        parts = directory.split("/")
        if len(parts) == 2 and parts[0] in split_of:
            counts[split_of[parts[0]]].setdefault(parts[1], 0)
    images: dict[str, zipfile.ZipInfo] = {}
    for rel in sorted(by_relative):
        parts = rel.split("/")
        suffix = posixpath.splitext(rel)[1].lower()
        if len(parts) == 1 and suffix in IMAGE_SUFFIXES:
            problems.append(Problem(rel, f"images belong in a class folder inside train/ or val/ (train/<class>/{rel})"))
            continue
        if len(parts) > 1 and parts[0] not in split_of:
            continue  # its folder is named above
        if suffix not in IMAGE_SUFFIXES:
            problems.append(Problem(rel, f"unexpected file type {suffix or '(none)'}: {CLASSIFY_LAYOUT}, so it has "
                                         "no label files and no data.yaml"))
        elif len(parts) != 3:
            problems.append(Problem(rel, f"images belong in a class folder directly inside {parts[0]}/ "
                                         f"({parts[0]}/<class>/{parts[-1]})"))
        else:
            counts[split_of[parts[0]]][parts[1]] = counts[split_of[parts[0]]].get(parts[1], 0) + 1
            images[rel] = by_relative[rel]
    for split, why in (("train", "the class folders to learn from"),
                       ("val", "Ultralytics measures accuracy on it after every epoch")):
        if split not in folder_of:
            problems.append(Problem(f"{split}/", f"is missing ({why}): {CLASSIFY_LAYOUT}"))
    for split, classes in counts.items():
        for name in sorted(classes):
            if not classes[name]:
                problems.append(Problem(f"{folder_of[split]}/{name}/", "holds no images: every class folder needs "
                                                                       "at least one image"))
    trained = set(counts.get("train", {}))
    if len(trained) == 1:
        problems.append(Problem(f"{folder_of['train']}/", f"has one class folder ({next(iter(trained))}/): a "
                                                          "classifier learns to tell classes apart, so it needs "
                                                          "at least two"))
    for split in ("val", "test"):
        if split not in counts or "train" not in counts:
            continue
        missing, extra = sorted(trained - set(counts[split])), sorted(set(counts[split]) - trained)
        if missing or extra:
            said = "; ".join(part for part in (
                f"missing from it: {', '.join(missing)}" if missing else "",
                f"not in train/: {', '.join(extra)}" if extra else "") if part)
            problems.append(Problem(f"{folder_of[split]}/", (
                f"has other class folders than train/ ({said}): Ultralytics numbers each split's classes by "
                f"its own folders, so every split needs train/'s class folders, each with images")))
    if not images and not problems:
        problems.append(Problem("(archive)", f"holds no images: {CLASSIFY_LAYOUT}"))
    problems.extend(_image_problems(archive, images, min_side=TRAINING_MIN_SIDE))
    if problems:
        summary = (f"is not a valid classification dataset ({len(problems)} "
                   f"problem{'s' if len(problems) > 1 else ''})")
        raise ArchiveRejected(_with_heic_note(summary, problems), problems)
    names = dict(enumerate(sorted(trained)))  # Ultralytics' order: sorted folder names of train/
    return ArchivePlan(members={}, directories=set(), data_yaml={}, names=names, splits=folder_of,
                       num_images=len(images), num_labels=0, uncompressed_bytes=0, kind="classify")


def _check_structure(archive, by_relative, members, dirs, skipped, declared, limits,
                     documents: set[str] = frozenset()) -> ArchivePlan:
    """``documents``: the skipped files beside data.yaml, relative to it — a ``train: train.txt``
    names one of them (a top-level .txt is taken for documentation), and is answered as the
    image-list file it is, not as a folder missing from the archive."""
    problems: list[Problem] = []
    yaml_name = next((n for n in DATA_YAML_NAMES if n in by_relative), None)
    if yaml_name is None:
        deeper = sorted((m for m, rel in members.items() if posixpath.basename(rel) in DATA_YAML_NAMES),
                        key=lambda m: (m.count("/"), m))
        only_images = bool(members) and all(posixpath.splitext(m)[1].lower() in IMAGE_SUFFIXES for m in members)
        if deeper:
            where = (f"missing at the top; found {deeper[0]}: upload the folder that holds data.yaml, or a zip of "
                     "it (one top folder around everything is stripped, deeper ones are not)")
        elif only_images:
            # Images to predict on, sent without their kind (new-user trial 20).
            where = ("missing, and the archive holds only images: to upload images to predict on, give the kind "
                     "'images' (the portal's Kind, yoloq dataset push --kind images, the API's kind=images)")
        else:
            where = "missing"
        raise ArchiveRejected("has no data.yaml at its top (it names the classes and the train/val image folders)",
                              [Problem("data.yaml", where)])
    for rel in by_relative:
        if posixpath.basename(rel) in DATA_YAML_NAMES and rel != yaml_name:
            problems.append(Problem(rel, "only one data.yaml, at the top of the archive, is allowed"))
    info = by_relative[yaml_name]
    if info.file_size > limits.max_yaml_bytes:
        raise ArchiveRejected("has a data.yaml that is too large",
                              [Problem(yaml_name, f"is {_human(info.file_size)}; the limit is "
                                                  f"{_human(limits.max_yaml_bytes)}")])
    try:
        document = load_yaml(_read_member(archive, info, limits.max_yaml_bytes), max_bytes=limits.max_yaml_bytes)
    except YamlError as exc:
        raise ArchiveRejected("has a data.yaml that cannot be read",
                              [Problem(yaml_name, exc.errors.get("spec", str(exc)))]) from None
    if not isinstance(document, dict):
        raise ArchiveRejected("has a data.yaml that is not a mapping", [Problem(yaml_name, "must be a mapping")])
    # Ultralytics' own dataset YAMLs (coco8.yaml) carry both; the stored data.yaml keeps neither
    # (data_yaml_text), so they are dropped and named in the upload's `skipped`, never followed: a
    # 'download' is never run, and the splits are read inside the archive, relative to data.yaml.
    dropped: list[str] = []
    if "download" in document:
        dropped.append(f"{yaml_name}: download (not kept: Ultralytics would execute it; the platform downloads "
                       "nothing)")
    if document.get("path") not in (None, "", ".", "./"):
        dropped.append(f"{yaml_name}: path (not kept: the splits are read inside the upload, relative to "
                       f"{yaml_name})")
    document = {key: value for key, value in document.items() if key not in ("download", "path")}
    names = _class_names(document)
    if isinstance(names, str):
        problems.append(Problem(f"{yaml_name}: names", names))
        names = {}
    kpt_shape, flip_idx = _keypoints(document, yaml_name, problems)
    kpt_names = _keypoint_names(document, yaml_name, names, kpt_shape, problems)

    image_files = {rel for rel in by_relative if posixpath.splitext(rel)[1].lower() in IMAGE_SUFFIXES}
    label_files = {rel for rel in by_relative if rel.endswith(LABEL_SUFFIX)}
    all_dirs = set(dirs) | {posixpath.dirname(rel) for rel in by_relative}
    for rel in list(all_dirs):
        while rel:
            rel = posixpath.dirname(rel)
            all_dirs.add(rel)
    splits: dict[str, str] = {}
    for key in SPLIT_KEYS:
        value = document.get(key)
        if value is None:
            if key != "test":
                problems.append(Problem(f"{yaml_name}: {key}", f"is required (a folder of images, e.g. images/{key})"))
            continue
        if not isinstance(value, str):
            problems.append(Problem(f"{yaml_name}: {key}", "must be one folder (e.g. images/train), not a list"))
            continue
        folder, bad = _split_folder(key, value, limits, all_dirs)
        if folder is None and not bad:  # Roboflow's test line without a test folder: no test split
            continue
        if bad:
            problems.append(Problem(f"{yaml_name}: {key}", bad))
            continue
        if folder in by_relative or folder in documents:
            problems.append(Problem(f"{yaml_name}: {key}",
                                    f"must be a folder of images; image-list files are not accepted ({value!r} is "
                                    f"a file: put its images in a folder, e.g. images/{key}, and name that)"))
            continue
        if folder not in all_dirs:
            problems.append(Problem(f"{yaml_name}: {key}", f"folder {value!r} is not in the archive"))
            continue
        in_split = [rel for rel in image_files if rel.startswith(folder + "/") or not folder]
        if not in_split:
            problems.append(Problem(f"{yaml_name}: {key}", f"folder {value!r} holds no images"))
            continue
        if "images" not in folder.split("/"):
            problems.append(Problem(f"{yaml_name}: {key}",
                                    "the image folder must be inside an 'images' folder (labels go in 'labels')"))
            continue
        splits[key] = folder

    misplaced_labels: list[str] = []
    for rel in sorted(label_files):
        if "labels" not in rel.split("/")[:-1]:
            misplaced_labels.append(rel)
            continue
        info = by_relative[rel]
        if info.file_size > limits.max_label_bytes:
            problems.append(Problem(rel, f"label file is {_human(info.file_size)}; the limit is "
                                         f"{_human(limits.max_label_bytes)}"))
            continue
        if names:
            try:
                text = _read_member(archive, info, limits.max_label_bytes).decode("utf-8")
            except UnicodeDecodeError:
                problems.append(Problem(rel, "is not UTF-8 text"))
                continue
            except ArchiveRejected as exc:
                problems.append(Problem(rel, exc.summary))
                continue
            bad = _label_problems(text, len(names), kpt_shape)
            if bad:
                problems.append(Problem(rel, bad))
        if len(problems) > MAX_REPORTED_PROBLEMS * 4:
            break
    # A label file with no image is never read: Ultralytics looks for an image's label, not the other
    # way round, so its objects left training without a word (trial21: a renamed or lost image).
    expected = {_label_of(rel) for rel in image_files}
    for rel in sorted(label_files):
        if rel not in expected and "labels" in rel.split("/")[:-1]:
            problems.append(Problem(rel, "has no image (images/…/<same name>.jpg, .png, …): Ultralytics reads "
                                         "labels only for the images it finds, so these objects would be left "
                                         "out of training; add the image or remove the label file"))
    placed: dict[str, zipfile.ZipInfo] = {}
    misplaced_images: list[str] = []
    for rel in sorted(image_files):
        if "images" not in rel.split("/")[:-1]:
            misplaced_images.append(rel)
        else:
            placed[rel] = by_relative[rel]
    problems.extend(_misplaced_problems(misplaced_images, misplaced_labels))
    problems.extend(_image_problems(archive, placed, min_side=TRAINING_MIN_SIDE))
    if not label_files and not problems:
        problems.append(Problem("labels/", "no label files: put one .txt per image under labels/"))
    if problems:
        summary = f"is not a valid YOLO dataset ({len(problems)} problem{'s' if len(problems) > 1 else ''})"
        raise ArchiveRejected(_with_heic_note(summary, problems), problems)
    return ArchivePlan(
        members=members, directories=dirs, data_yaml=document, names=names, splits=splits,
        num_images=len(image_files), num_labels=len(label_files), uncompressed_bytes=declared, skipped=skipped,
        kpt_shape=kpt_shape, flip_idx=flip_idx, kpt_names=kpt_names, dropped_keys=dropped,
    )


def _label_of(image: str) -> str:
    """Where Ultralytics looks for an image's label (``img2label_paths``): the last ``images`` folder
    of its path replaced by ``labels``, the suffix by ``.txt``."""
    parts = image.split("/")
    folders = parts[:-1]
    if "images" in folders:
        at = len(folders) - 1 - folders[::-1].index("images")
        parts[at] = "labels"
    return posixpath.splitext("/".join(parts))[0] + LABEL_SUFFIX


def _split_folder(key: str, value: str, limits: ArchiveLimits, all_dirs: set[str]) -> tuple[str | None, str]:
    """data.yaml's ``train``/``val``/``test`` value → (the folder relative to the archive's top, '')
    or (None, why not); (None, '') for a Roboflow ``test`` line whose folder the export left out.

    Ultralytics resolves a split against the YAML's folder and, when that does not exist and the
    value starts with ``../``, tries it without the ``../``: Roboflow writes ``train: ../train/images``
    for a zip whose ``train/images`` sits beside data.yaml. The same here, so that form means
    ``train/images`` when that folder is in the archive; any other ``..`` is refused.
    """
    if value.startswith("../"):
        inside = _normalize(value[3:])
        if _name_problem(value[3:], limits) is None and not inside.startswith(".."):
            if inside in all_dirs:
                return inside, ""
            if key == "test" and inside == "test/images":
                return None, ""  # Roboflow writes 'test: ../test/images' even without a test split
            return None, (f"folder {inside!r} is not in the archive (Ultralytics reads {value!r} as {inside!r} "
                          "beside data.yaml)")
    if value.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", value):
        return None, _absolute_split_problem(key, value, all_dirs)
    if ".." in [part for part in value.split("/") if part]:
        return None, (f"{value!r} points outside the archive ('..'); name a folder inside it, relative to "
                      "data.yaml (e.g. images/train)")
    bad = _name_problem(value, limits)
    if bad:
        return None, bad
    return _normalize(value), ""


def _absolute_split_problem(key: str, value: str, all_dirs: set[str]) -> str:
    """Why an absolute split path (``train: /home/me/pets/images/train``, ``C:\\data\\images\\train``:
    what a YAML written for one's own machine holds) is refused, and the relative form to write
    instead: the longest tail of it that is a folder in the archive (trial30: the answer said only
    "absolute path")."""
    parts = [part for part in re.split(r"[\\/]+", value) if part]
    if parts and re.fullmatch(r"[A-Za-z]:", parts[0]):
        parts = parts[1:]
    tails = ("/".join(parts[at:]) for at in range(len(parts)))
    found = next((tail for tail in tails if tail in all_dirs), None)
    why = f"'{value}' is an absolute path (a folder on the machine the YAML was written on)"
    if found:
        return f"{why}; write it relative to data.yaml: {key}: {found}"
    return f"{why}; name a folder inside the upload, relative to data.yaml (e.g. {key}: images/{key})"


def _image_problems(archive: zipfile.ZipFile, images: dict[str, zipfile.ZipInfo], *,
                    min_side: int = 1) -> list[Problem]:
    """One problem per image whose header Pillow cannot read (what Ultralytics opens each image
    with: it skips the ones that fail as corrupt, so a training run would quietly lose them).

    Only the header is parsed (format and size), reading from the zip as Pillow asks for bytes:
    a 150 MB file of random bytes is refused after its first few bytes, and nothing is decoded.
    All are counted (``problem_count``); the report lists the first MAX_REPORTED_PROBLEMS.
    """
    problems: list[Problem] = []
    for rel in sorted(images):
        if why := _image_header_problem(archive, images[rel], min_side=min_side):
            problems.append(Problem(rel, why))
    return problems


def _with_heic_note(summary: str, problems: list[Problem]) -> str:
    """The summary, and when images are HEIC, how many, what to do and the first few names: that
    is the one problem a phone's photos have, however many there are."""
    heic = [p.path for p in problems if p.problem == HEIC_PROBLEM]
    if not heic:
        return summary
    named = ", ".join(heic[:HEIC_NAMED]) + (f" and {len(heic) - HEIC_NAMED} more" if len(heic) > HEIC_NAMED else "")
    many = len(heic) > 1
    return (f"{summary}; {len(heic)} image{'s are' if many else ' is'} HEIC, which training cannot read; convert "
            f"{'them' if many else 'it'} to JPEG or PNG (e.g. `magick mogrify -format jpg *.heic`, "
            f"`heif-convert IMG_0001.heic IMG_0001.jpg`, or Export… as JPEG in macOS Preview): {named}")


def _is_heic(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> bool:
    """A HEIC/HEIF file by its suffix or its first box ('ftyp' and a HEIF major brand)."""
    if posixpath.splitext(info.filename)[1].lower() in HEIC_SUFFIXES:
        return True
    try:
        with archive.open(info) as stream:
            head = stream.read(12)
    except (zipfile.BadZipFile, OSError, EOFError, RuntimeError, NotImplementedError):
        return False
    return head[4:8] == b"ftyp" and head[8:12] in HEIC_BRANDS


def _image_header_problem(archive: zipfile.ZipFile, info: zipfile.ZipInfo, *, min_side: int = 1) -> str:
    """Why this member is not an image Pillow can open, or one under ``min_side`` pixels a side ('' when it is)."""
    if info.file_size == 0:
        return "is an empty file, not an image"
    try:
        with archive.open(info) as stream, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # DecompressionBombWarning: Ultralytics opens those too
            with Image.open(stream) as image:
                width, height = image.size
    except Exception as exc:  # noqa: BLE001 - Pillow raises many types for a bad header; each means "not readable"
        if _is_heic(archive, info):  # whatever Pillow (or Ultralytics' patch of it) raised
            return HEIC_PROBLEM
        if isinstance(exc, UnidentifiedImageError):
            return "is not a readable image: its first bytes are no image format Pillow (and so Ultralytics) reads"
        return f"is not a readable image ({type(exc).__name__}: {str(exc)[:200]})"
    if width < 1 or height < 1:
        return f"is an image of {width}×{height} pixels"
    if width < min_side or height < min_side:
        return (f"is an image of {width}×{height} pixels: training skips images under {min_side} pixels a side "
                f"as corrupt")
    return ""


def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int) -> bytes:
    try:
        with archive.open(info) as stream:
            data = stream.read(limit + 1)
    except (zipfile.BadZipFile, OSError, EOFError, RuntimeError, NotImplementedError) as exc:
        raise ArchiveRejected(f"member cannot be read ({exc})", [Problem(info.filename, str(exc))]) from None
    if len(data) > limit:
        raise ArchiveRejected("member is larger than declared", [Problem(info.filename, "inflates past its limit")])
    return data


# --- extraction -------------------------------------------------------------------------------


def archive_extract(upload: IO[bytes], plan: ArchivePlan, *, destination: Path) -> None:
    """Extract the planned members into ``destination`` (must not exist yet)."""
    destination.mkdir(mode=0o755)
    root = destination.resolve()
    upload.seek(0)
    with zipfile.ZipFile(upload) as archive:
        for relative in sorted(plan.directories):
            _safe_target(root, relative).mkdir(parents=True, exist_ok=True)
        for name, relative in plan.members.items():
            if posixpath.basename(relative) in DATA_YAML_NAMES:
                continue  # rewritten by the caller with the real paths
            info = archive.getinfo(name)
            target = _safe_target(root, relative)
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.parent.resolve().is_relative_to(root):
                raise ArchiveRejected("would write outside the dataset folder", [Problem(name, "escapes")])
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
            written = 0
            with os.fdopen(fd, "wb") as out, archive.open(info) as stream:
                while chunk := stream.read(1024 * 1024):
                    written += len(chunk)
                    if written > info.file_size:
                        raise ArchiveRejected("a member inflates past its declared size",
                                              [Problem(name, "inflates past its declared size")])
                    out.write(chunk)


def _safe_target(root: Path, relative: str) -> Path:
    target = (root / relative)
    if not target.resolve().is_relative_to(root):
        raise ArchiveRejected("would write outside the dataset folder", [Problem(relative, "escapes")])
    return target


def data_yaml_text(plan: ArchivePlan) -> str:
    """The data.yaml the platform stores: relative split folders, the names and a pose dataset's
    ``kpt_shape``, ``flip_idx`` and ``kpt_names`` (checked by :func:`archive_inspect`), no extras.

    No ``path``: Ultralytics then takes the YAML's own folder as the dataset root, so a
    stored version stays valid wherever the data store is mounted (rows hold keys only).
    """
    document: dict[str, Any] = {}
    for key in SPLIT_KEYS:
        if key in plan.splits:
            document[key] = plan.splits[key]
    document["names"] = plan.names
    if plan.kpt_shape:
        document["kpt_shape"] = plan.kpt_shape
        if plan.flip_idx is not None:
            document["flip_idx"] = plan.flip_idx
        if plan.kpt_names is not None:
            document["kpt_names"] = plan.kpt_names
    return yaml.safe_dump(document, sort_keys=False)
