"""worker/artifacts.with_storage: a long fetch or upload keeps the attempt heartbeating, so the
scheduler does not end it as lost while it copies; a stop said meanwhile is honoured after it."""

from __future__ import annotations

import threading
import time

from worker.artifacts import with_storage


def test_the_attempt_heartbeats_while_a_transfer_runs(settings):
    settings.HEARTBEAT_S = 0.2
    beats = []

    def check_in() -> str:
        beats.append(threading.current_thread().name)
        return ""

    result, stop = with_storage(None, "fetching datasets/x", lambda: time.sleep(1.5) or "copied", check_in)
    assert (result, stop) == ("copied", "")
    assert len(beats) >= 4 and set(beats) == {"storage-heartbeat"}
    count = len(beats)
    time.sleep(0.5)
    assert len(beats) == count  # no heartbeats after the transfer


def test_a_stop_said_during_a_transfer_ends_it(settings):
    settings.HEARTBEAT_S = 0.2
    answers = iter(["", "cancelled"])
    result, stop = with_storage(None, "uploading results", lambda: time.sleep(1.0) or "stored",
                                lambda: next(answers, "cancelled"))
    assert (result, stop) == (None, "cancelled")
