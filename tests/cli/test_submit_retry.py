"""A submit that gets no answer in time says how to retry it safely: its job may have been queued,
and the key it was sent with returns that job rather than a second one (trial 32)."""

from __future__ import annotations

import socket
import threading

import pytest

from cli import yoloq


@pytest.fixture
def silent_server():
    """A server that takes the connection and never answers, as a web stuck behind its proxy does."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    taken: list[socket.socket] = []
    stop = threading.Event()

    def accept():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                taken.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join()
    for connection in taken:
        connection.close()
    listener.close()


def test_a_submit_that_timed_out_names_the_key_to_retry_with(silent_server, config, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("YOLOQ_URL", silent_server)
    monkeypatch.setenv("YOLOQ_TOKEN", "yp_x")
    monkeypatch.setattr(yoloq, "TIMEOUT_S", 0.5)
    spec = tmp_path / "job.yaml"
    spec.write_text("task_name: t\ncommand: yolo train data=demo model=yolov8n.yaml epochs=1\n")

    assert yoloq.main(["submit", str(spec)]) == 1
    err = capsys.readouterr().err
    assert "timed out" in err and "may have been queued" in err
    key = err.rsplit("--idempotency-key ", 1)[1].strip()
    assert key.startswith("yoloq-")

    assert yoloq.main(["submit", str(spec), "--idempotency-key", "ci-42"]) == 1
    assert capsys.readouterr().err.rstrip().endswith("run again with --idempotency-key ci-42")
