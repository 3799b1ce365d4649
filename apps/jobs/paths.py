"""What a team member may read of server paths: names relative to their job or team, nothing else.

The worker keeps absolute paths server-side (``Job.spec["resolved"]``, ``weights_path``,
checkpoint rows). Text that reaches people — logs, errors, event messages and data —
goes through :func:`public_text` (issue 9, finding 8):

1. a path inside the job's run folder becomes relative to it (``train/weights/best.pt``);
2. a path inside the team's dataset or weights folder becomes relative to that folder
   (``pcb/images/train``); the shared dataset and weights stores likewise;
3. any other absolute path (the virtualenv, the code, another team's folder) keeps only
   its last component (``…/trainer.py``).

URLs (``https://…``) and ratios (``1/10``) are left alone: a path here starts with ``/``
at the start of a word. What a person wrote for the team to read (``said``: an operator's
drain reason) is kept as written: "see /wiki/maint-42" is not a server path.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from django.conf import settings

# An absolute path: "/" at the start of a word (not after a letter, digit, ":", "/" or "."),
# then characters paths are usually made of. Quotes, brackets, commas and spaces end it.
_ABSOLUTE = re.compile(r"(?<![\w:/.~-])/(?:[^\s'\"`()\[\]{}<>,;|]+)")
_ANSI = re.compile(r"(\x1b\[[0-9;?]*[A-Za-z])")
# Python traceback frames: the header, each "File ..." line and the source line under it.
_TRACEBACK_HEADER = re.compile(r"^\s*Traceback \(most recent call last\):\s*$")
_TRACEBACK_FRAME = re.compile(r'^\s+File "[^"]*", line \d+')
_TRACEBACK_CHAIN = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)


def _roots(job=None, team=None) -> list[tuple[str, str]]:
    """(absolute prefix, what it becomes), longest first so the most specific wins."""
    roots: list[tuple[Path, str]] = []
    if job is not None:
        roots.append((Path(settings.JOBS_DIR) / str(job.pk), ""))
        team = team if team is not None else getattr(job, "team", None)
    if team is not None:
        roots.append((Path(settings.DATASETS_DIR) / team.slug, ""))
        roots.append((Path(settings.WEIGHTS_DIR) / team.slug, ""))
    roots.append((Path(settings.DATASETS_DIR) / "_shared", ""))
    roots.append((Path(settings.WEIGHTS_DIR), ""))
    found: list[tuple[str, str]] = []
    for path, replacement in roots:
        for variant in {str(path), str(path.resolve())}:
            found.append((variant.rstrip("/"), replacement))
    return sorted(found, key=lambda pair: len(pair[0]), reverse=True)


def public_path(path: str, *, job=None, team=None, roots: list[tuple[str, str]] | None = None) -> str:
    """One absolute path → what the caller may see of it."""
    for prefix, replacement in roots if roots is not None else _roots(job, team):
        if path == prefix:
            return replacement or "."
        if path.startswith(prefix + "/"):
            rest = path[len(prefix) + 1:]
            return f"{replacement}/{rest}" if replacement else rest
    name = path.rstrip("/").rsplit("/", 1)[-1]
    return f"…/{name}" if name else "…"


def public_text(text: str, *, job=None, team=None, said: Sequence[str] = ()) -> str:
    """Replace every absolute path in ``text`` (see the module docstring).

    ``said``: parts of ``text`` a person typed for its readers, kept whole wherever they occur;
    only the text around them is scrubbed (optrial24, F5: a drain reason ``see /wiki/maint-42``
    became ``see …/maint-42``). Pass people's words only, never text a path may come from.

    A NUL becomes U+FFFD, as undecodable bytes of the output already do: what passes here is stored,
    and PostgreSQL stores no NUL in text (a worker's write of such a log line failed: trial28 F8).
    """
    if text and "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    if not text or "/" not in text:
        return text
    kept = sorted({part for part in said if part}, key=len, reverse=True)
    if kept:
        pieces = re.split("(" + "|".join(map(re.escape, kept)) + ")", text)
        # re.split with one group: the odd pieces are the kept parts themselves.
        return "".join(piece if index % 2 else public_text(piece, job=job, team=team)
                       for index, piece in enumerate(pieces))
    roots = _roots(job, team)
    # Terminal colour codes ("\x1b[1m/abs/path\x1b[0m" in Ultralytics' output) would hide the
    # start of a path from the pattern: substitute between them, keep them as they are.
    parts = _ANSI.split(text)
    for index in range(0, len(parts), 2):
        parts[index] = _ABSOLUTE.sub(lambda match: public_path(match.group(0), roots=roots), parts[index])
    return "".join(parts)


def ansi_strip(text: str) -> str:
    """``text`` without terminal colour codes: Ultralytics colours its messages (``\x1b[31m…``),
    which a stored error, an event or a page would show as litter."""
    return _ANSI.sub("", text) if text and "\x1b" in text else text


def public_value(value: Any, *, job=None, team=None) -> Any:
    """:func:`public_text` over every string in a JSON-like value."""
    if isinstance(value, str):
        return public_text(value, job=job, team=team)
    if isinstance(value, dict):
        return {key: public_value(item, job=job, team=team) for key, item in value.items()}
    if isinstance(value, list):
        return [public_value(item, job=job, team=team) for item in value]
    return value


def traceback_strip(lines: list[str]) -> list[str]:
    """Drop Python traceback frames; keep everything else, including the exception's own line."""
    kept: list[str] = []
    in_frame = False
    for line in lines:
        if _TRACEBACK_HEADER.match(line) or line.strip() in _TRACEBACK_CHAIN:
            in_frame = False
            continue
        if _TRACEBACK_FRAME.match(line):
            in_frame = True  # the indented lines under it are its source (and 3.11's ^^^ markers)
            continue
        if in_frame and line.startswith("    "):
            continue
        in_frame = False
        kept.append(line)
    return kept
