"""manage.py restore of a folder that is not a backup, and backup into a file or where no folder can
be made: a CommandError saying so, not a
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


def test_a_backup_onto_a_file_or_where_no_folder_can_be_made_is_refused_in_words(tmp_path):
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(CommandError, match=r"a-file is a file: give a new \(or empty\) folder"):
        call_command("backup", str(tmp_path / "a-file"))
    with pytest.raises(CommandError, match=r"cannot make the folder .*/a-file/below: Not a directory"):
        call_command("backup", str(tmp_path / "a-file" / "below"))


@pytest.mark.parametrize("manifest", ['{"name": "site", "version": "1.0.0"}', "[]", '"x"'])
def test_another_tools_manifest_json_is_refused_in_words(tmp_path, manifest):
    """manifest.json is a common name (web app manifests, npm/asset-pipeline outputs, other backup
    tools): a folder holding someone else's passed the new "has no manifest.json" check and then
    failed with KeyError: 'engine' / TypeError tracebacks at manifest["engine"] (review26)."""
    (tmp_path / "manifest.json").write_text(manifest)
    with pytest.raises(CommandError, match=r"is not a backup|manifest.json cannot be read"):
        call_command("restore", str(tmp_path))
