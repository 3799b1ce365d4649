"""A GPU node's artifact cache (worker/cache.py) on a real directory: pruned to
ARTIFACTS_CACHE_MAX_GB, least recently used first, never an entry a job on the node holds."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from django.conf import settings as django_settings

from worker.cache import cache_entry, cache_entry_hold, cache_prune

MiB = 2**20


@pytest.fixture
def cache(settings, tmp_path):
    settings.ARTIFACTS_CACHE_DIR = tmp_path / "node" / "cache"
    return settings.ARTIFACTS_CACHE_DIR


def cached(tag: str, mib: int, used_minutes_ago: float, dataset: bool = False):
    """An entry as the worker leaves it: weights beside their name, or a dataset folder."""
    entry = cache_entry(tag)
    target = entry / "dataset" / "images" / "a.jpg" if dataset else entry / "best.pt"
    target.parent.mkdir(parents=True)
    target.write_bytes(b"w" * (mib * MiB))
    used = time.time() - used_minutes_ago * 60
    os.utime(entry, (used, used))
    return entry


def left(entries: dict) -> set[str]:
    return {name for name, entry in entries.items() if entry.exists()}


def test_it_removes_the_least_recently_used_entries_until_the_cache_fits(cache, settings):
    settings.ARTIFACTS_CACHE_MAX_GB = 5 / 1024  # 5 MiB
    entries = {"oldest": cached("aa" * 32, 2, 300, dataset=True), "old": cached("bb" * 32, 2, 200),
               "recent": cached("cc" * 32, 2, 100, dataset=True), "newest": cached("dd" * 32, 2, 1)}
    assert cache_prune() == (2, 4 * MiB)
    assert left(entries) == {"recent", "newest"}
    assert cache_prune() == (0, 0)


def test_an_entry_in_use_stays_and_the_next_least_recently_used_goes_instead(cache, settings):
    settings.ARTIFACTS_CACHE_MAX_GB = 5 / 1024
    entries = {"oldest": cached("aa" * 32, 2, 300, dataset=True), "old": cached("bb" * 32, 2, 200),
               "recent": cached("cc" * 32, 2, 100), "newest": cached("dd" * 32, 2, 1)}
    # A work-horse training on the oldest dataset: another process, holding it as an attempt does.
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from worker.cache import cache_entry_hold;"
         "cache_entry_hold(Path(sys.argv[1])); print('held', flush=True); time.sleep(60)", str(entries["oldest"])],
        cwd=django_settings.BASE_DIR, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert cache_prune() == (2, 4 * MiB)
        assert left(entries) == {"oldest", "newest"}
    finally:
        holder.kill()
        holder.wait()
    settings.ARTIFACTS_CACHE_MAX_GB = 3 / 1024
    assert cache_prune() == (1, 2 * MiB), "let go when its process ended"
    assert left(entries) == {"oldest"}, "its last use was the attempt that held it"


def test_holding_an_entry_marks_it_used_now(cache, settings):
    settings.ARTIFACTS_CACHE_MAX_GB = 3 / 1024
    entries = {"old": cached("aa" * 32, 2, 300), "newer": cached("bb" * 32, 2, 100)}
    os.close(cache_entry_hold(entries["old"]))  # an attempt read it again, then ended
    assert cache_prune() == (1, 2 * MiB)
    assert left(entries) == {"old"}


def test_a_cache_under_its_cap_and_a_missing_cache_are_left_alone(cache, settings):
    settings.ARTIFACTS_CACHE_MAX_GB = 20.0
    assert cache_prune() == (0, 0)
    entries = {"one": cached("aa" * 32, 1, 300)}
    assert cache_prune() == (0, 0)
    assert left(entries) == {"one"}
