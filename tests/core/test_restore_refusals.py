"""manage.py restore of a folder that is not a backup: a CommandError saying so, not a
FileNotFoundError traceback (optrial24). The whole round trip: tests/integration/test_backup_restore.py."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError


def test_a_missing_folder_an_empty_one_and_a_bad_manifest_are_refused_in_words(tmp_path):
    with pytest.raises(CommandError, match=r"optrial24-typo is not a folder: give the folder manage.py backup wrote"):
        call_command("restore", str(tmp_path / "optrial24-typo"))
    with pytest.raises(CommandError, match=r"is not a backup: it has no manifest.json"):
        call_command("restore", str(tmp_path))
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(CommandError, match=r"manifest.json cannot be read"):
        call_command("restore", str(tmp_path))
