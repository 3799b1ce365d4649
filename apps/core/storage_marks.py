"""The installation's marker in each shared root: how a machine tells that it sees *this*
installation's shared storage (one ``DATA_DIR`` mounted everywhere, no object store).

Each artifact root (``DATASETS_DIR``, ``JOBS_DIR``, ``MODELS_DIR``, ``WEIGHTS_DIR``: they may
be separate mounts) holds a file ``.yoloportal-storage`` with the token of the one
:class:`~apps.core.models.StorageMark` row. A GPU server whose view of a root lacks the file
(its mount dropped: the empty mount point shows) or holds another token (a mount of another
export) cannot run jobs from there, and says which root.

Why a marker and not the datasets' files (the check before): a root other than the datasets'
that dropped alone went unseen, and the newest datasets' files deleted by hand made every
node look cut off. The marker is the installation's own: no user action removes it.

Who writes it: the scheduler (``manage.py scheduler``, at its first pass as leader and every
minute after, so a marker deleted by hand is back within a minute). It runs where the web
runs in every deploy/ file, with the same storage; ``make run`` starts one too. A GPU server
never writes it: an empty mount point would then pass its own test. Nobody checks before the
row's ``written_at`` is set (an installation upgraded before its scheduler ran, or one whose
scheduler cannot write): the worker falls back to the datasets' files
(worker/artifacts.py), as before.
"""

from __future__ import annotations

import logging
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from django.db import IntegrityError, transaction
from django.utils import timezone

from apps.core.artifacts import ROOTS, root_path
from apps.core.models import StorageMark
from apps.core.storage import shared_filesystem

log = logging.getLogger(__name__)

MARKER_NAME = ".yoloportal-storage"


@dataclass(frozen=True)
class RootProblem:
    setting: str  # DATASETS_DIR, JOBS_DIR, …: what an operator looks up
    path: Path  # the marker file this machine looked for
    what: str  # "no storage marker", "another installation's storage marker", "unreadable (…)"


def shared_roots() -> list[tuple[str, Path]]:
    """(setting, folder) of each distinct artifact root, when they are a shared filesystem; else []."""
    if not shared_filesystem():
        return []  # an object store: the roots are each node's own cache, nothing shared to lose
    roots, seen = [], set()
    for root, setting in ROOTS.items():
        folder = root_path(root)
        if folder not in seen:
            seen.add(folder)
            roots.append((setting, folder))
    return roots


def storage_mark() -> StorageMark:
    """The installation's row, made on first use (two schedulers at once get the same one)."""
    mark = StorageMark.objects.filter(pk=1).first()
    if mark is not None:
        return mark
    try:
        with transaction.atomic():
            return StorageMark.objects.create(pk=1, token=uuid.uuid4().hex)
    except IntegrityError:
        return StorageMark.objects.get(pk=1)


def storage_mark_renew() -> None:
    """A restored installation is a new one (``manage.py restore``): its database brought the old
    token, with ``written_at`` set, but no marker files (backups skip hidden files). Kept, every
    node's check failed until the restored scheduler's first chore, and a copy restored beside
    production shared production's token, so the markers could not tell the two apart (review22).
    Now it gets a token of its own, nodes fall back to the datasets' files until its scheduler
    has written the markers, and an old marker left in a root goes."""
    StorageMark.objects.all().delete()
    for _setting, folder in shared_roots():
        (folder / MARKER_NAME).unlink(missing_ok=True)


def _read(path: Path) -> str | None:
    """The marker's token, None when there is no such file; OSError when it cannot be read."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return None


def storage_marks_write() -> int:
    """Write the marker into each shared root that lacks it (the scheduler's chore); how many written.

    A root holding another token is left alone and said in the log: this machine mounts another
    installation's storage there, and overwriting it would hide that from every node. Once every
    root holds the token the row's ``written_at`` is set, and from then on the nodes check.
    """
    roots = shared_roots()
    if not roots:
        return 0
    mark = storage_mark()
    written, complete = 0, True
    for setting, folder in roots:
        path = folder / MARKER_NAME
        try:
            found = _read(path)
            if found == mark.token:
                continue
            if found is not None:
                complete = False
                log.error("%s (%s) holds another installation's storage marker (%s; this one's is %s): not "
                          "overwritten. Is the wrong export mounted there? If the storage was moved on purpose, "
                          "delete that file", setting, path, found, mark.token)
                continue
            folder.mkdir(parents=True, exist_ok=True)
            partial = folder / f"{MARKER_NAME}.{os.getpid()}.tmp"
            partial.write_text(mark.token + "\n")
            os.replace(partial, path)  # whole or not at all: a node never reads half a token
        except OSError as exc:
            complete = False
            log.error("cannot write the storage marker into %s (%s): %s", setting, folder, exc)
            continue
        written += 1
        log.info("storage marker written into %s (%s)", setting, path)
    if complete and mark.written_at is None:
        StorageMark.objects.filter(pk=mark.pk, written_at__isnull=True).update(written_at=timezone.now())
    return written


def storage_marks_expected() -> list[dict] | None:
    """What a machine should find: [{"setting", "path", "token"}] per shared root, or None when
    nothing is to be checked (an object store, or markers not written yet). Also handed to the
    Slurm relay, which has no database."""
    roots = shared_roots()
    if not roots:
        return None
    mark = StorageMark.objects.filter(pk=1, written_at__isnull=False).first()
    if mark is None:
        return None
    return [{"setting": setting, "path": str(folder / MARKER_NAME), "token": mark.token} for setting, folder in roots]


def storage_marks_missing(expected: list[dict]) -> list[RootProblem]:
    """The roots whose marker this machine does not see as expected (the relay, Django-free, has its
    own few lines for it: worker/executors/relay.py ``storage_problem``)."""
    problems = []
    for root in expected:
        path = Path(root["path"])
        try:
            found = _read(path)
        except OSError as exc:  # a soft NFS mount that went away answers EIO / ESTALE
            problems.append(RootProblem(root["setting"], path, f"unreadable ({exc.strerror or exc})"))
            continue
        if found is None:
            problems.append(RootProblem(root["setting"], path, "no storage marker"))
        elif found != root["token"]:
            problems.append(RootProblem(root["setting"], path, "another installation's storage marker"))
    return problems


def storage_marks_check() -> list[RootProblem] | None:
    """This machine's view of the shared roots: the roots it does not see as this installation's
    ([] = all fine), or None when there is nothing to check yet (see the module's docstring)."""
    expected = storage_marks_expected()
    if expected is None:
        return None
    return storage_marks_missing(expected)


def roots_said(problems: list[RootProblem]) -> str:
    """``JOBS_DIR (no storage marker), WEIGHTS_DIR (…)``: short, no paths (every user sees it)."""
    return ", ".join(f"{p.setting} ({p.what})" for p in problems)
