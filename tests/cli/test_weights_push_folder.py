"""yoloq weights push of a folder says it is one (new-user trial 27: "ds: no such file" of a folder that
was there)."""

from __future__ import annotations

from cli import yoloq


def test_weights_push_of_a_folder_says_it_is_a_folder_before_sending(tmp_path, config, capsys):
    config.parent.mkdir(parents=True)
    config.write_text('{"url": "http://127.0.0.1:9", "token": "t"}')  # nothing answers there: nothing is sent
    (tmp_path / "pcb").mkdir()
    assert yoloq.main(["weights", "push", str(tmp_path / "pcb")]) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'pcb'}: is a folder; weights push sends one .pt file" in err, err
    assert f"yoloq dataset push {tmp_path / 'pcb'}" in err
