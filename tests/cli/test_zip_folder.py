"""yoloq dataset push's zip of a folder follows symbolic links, as ``zip -r`` does, and never leaves a
file out without saying so (new-user trial 27, F2: a linked file was counted as a "hidden/cache file"
left out, a linked folder vanished without a word)."""

from __future__ import annotations

import zipfile

import pytest

from cli import yoloq
from tests.datasets.archives import valid_files


def dataset_folder(root, name="pcb"):
    folder = root / name
    for relative, data in valid_files().items():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_bytes(data)
    return folder


def test_a_linked_folder_and_a_linked_file_are_zipped_with_their_contents(tmp_path):
    folder = dataset_folder(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    (folder / "images" / "val").rename(elsewhere)
    (folder / "images" / "val").symlink_to(elsewhere)  # the images kept where they are, linked in
    real = tmp_path / "0.png"
    (folder / "images" / "train" / "0.png").rename(real)
    (folder / "images" / "train" / "0.png").symlink_to(real)
    (folder / ".DS_Store").write_bytes(b"x")

    written, skipped, linked = yoloq.zip_folder(folder, tmp_path / "out.zip")

    names = zipfile.ZipFile(tmp_path / "out.zip").namelist()
    assert sorted(names) == sorted(f"pcb/{name}" for name in valid_files())
    assert zipfile.ZipFile(tmp_path / "out.zip").read("pcb/images/val/1.png") == valid_files()["images/val/1.png"]
    assert (written, skipped, linked) == (len(valid_files()), 1, 3)


def test_a_link_to_nothing_is_refused_naming_it(tmp_path):
    folder = dataset_folder(tmp_path)
    (folder / "images" / "train" / "2.png").symlink_to(tmp_path / "gone.png")
    with pytest.raises(yoloq.CliError, match=r"2\.png: is a symbolic link to .*gone\.png, which does not exist"):
        yoloq.zip_folder(folder, tmp_path / "out.zip")


def test_a_link_to_a_folder_that_holds_it_is_refused_as_a_loop(tmp_path):
    folder = dataset_folder(tmp_path)
    (folder / "images" / "again").symlink_to(folder)
    with pytest.raises(yoloq.CliError, match="a loop"):
        yoloq.zip_folder(folder, tmp_path / "out.zip")


def test_push_refuses_a_folder_with_a_link_to_nothing_before_sending(tmp_path, config, capsys):
    config.parent.mkdir(parents=True)
    config.write_text('{"url": "http://127.0.0.1:9", "token": "t"}')  # nothing answers there: nothing is sent
    folder = dataset_folder(tmp_path)
    (folder / "labels" / "val" / "9.txt").symlink_to(tmp_path / "gone.txt")
    assert yoloq.main(["dataset", "push", str(folder)]) == 1
    assert "9.txt: is a symbolic link to" in capsys.readouterr().err


def test_a_link_to_nothing_or_a_loop_among_the_hidden_files_is_left_out_with_them(tmp_path):
    """An editor's lock file (Emacs' ``.#name``, a link to nothing) or a loop inside a hidden folder
    is left out as every hidden/cache file is, not a reason to refuse the whole folder."""
    folder = dataset_folder(tmp_path)
    (folder / ".#data.yaml").symlink_to("user@host.4242:1700000000")  # what Emacs leaves while editing
    (folder / ".venv" / "lib").mkdir(parents=True)
    (folder / ".venv" / "lib" / "again").symlink_to(folder / ".venv")

    written, skipped, _ = yoloq.zip_folder(folder, tmp_path / "out.zip")

    assert sorted(zipfile.ZipFile(tmp_path / "out.zip").namelist()) == sorted(f"pcb/{n}" for n in valid_files())
    assert (written, skipped) == (len(valid_files()), 2)


def test_a_hidden_folder_or_a_hidden_link_to_a_big_tree_is_left_out_unentered(tmp_path):
    """A ``.git`` (or a hidden link to a big tree) is left out as one entry, not walked file by file
    first: that walk only cost time, its files left out anyway (review32)."""
    folder = dataset_folder(tmp_path)
    big = tmp_path / "big"
    for n in range(50):
        (big / f"d{n % 5}").mkdir(parents=True, exist_ok=True)
        (big / f"d{n % 5}" / f"{n}.bin").write_bytes(b"x")
    (folder / ".git" / "objects").mkdir(parents=True)
    (folder / ".git" / "objects" / "ab").write_bytes(b"x")
    (folder / ".ipynb_checkpoints").symlink_to(big)
    (folder / "images" / ".trash").symlink_to(big)

    written, skipped, linked = yoloq.zip_folder(folder, tmp_path / "out.zip")

    assert sorted(zipfile.ZipFile(tmp_path / "out.zip").namelist()) == sorted(f"pcb/{n}" for n in valid_files())
    assert (written, skipped, linked) == (len(valid_files()), 3, 0)


def test_an_empty_folder_goes_in_but_not_an_empty_hidden_one(tmp_path):
    folder = dataset_folder(tmp_path)
    (folder / "images" / "test").mkdir()
    (folder / ".ipynb_checkpoints" / "empty").mkdir(parents=True)

    yoloq.zip_folder(folder, tmp_path / "out.zip")

    names = zipfile.ZipFile(tmp_path / "out.zip").namelist()
    assert "pcb/images/test/" in names and not any(".ipynb" in name for name in names)
