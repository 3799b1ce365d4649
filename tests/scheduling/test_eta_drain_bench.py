"""bench/eta_drain.py: the drain estimate uses only what was known at each submit."""

from __future__ import annotations

import math

import pytest

from apps.scheduling.policy.eta_calibration import OFFSET_S

eta_drain = pytest.importorskip("bench.eta_drain")

DAY = 86400.0


def rec(submit, point, start, gpus=1.0, constrained=False):
    # [submit, model point, low, high, first start, finished?, GPUs, GPU models constrained?, class, position]
    return [submit, point, None, None, start, True, gpus, constrained, "normal", 1]


def test_a_job_counts_its_shapes_queue_and_recent_starts_but_nothing_after_its_submit() -> None:
    records = [
        rec(0, 10, 5),  # 1 GPU, started at 5 (before the probe's submit)
        rec(1, 2 * DAY, 3 * DAY),  # 1 GPU, still waiting at 100
        rec(2, 2 * DAY, 50),  # 8 GPUs: another shape
        rec(100, 3 * DAY, 4 * DAY),  # the probe
        rec(150, 10, 160),  # submitted after the probe: not in its queue
    ]
    records[2][6] = 8.0
    counts = eta_drain.drain_counts(records, window_s=DAY)
    assert counts[3] == (1, 1)  # one 1-GPU job queued, one 1-GPU start in the day before
    assert counts[4] == (2, 1)  # the probe now waits too; the 8-GPU start is another shape's


def test_only_waiting_jobs_predicted_past_the_threshold_get_the_blended_point() -> None:
    records = [
        rec(0, 10, 5),
        rec(10, 10 + 3600, 10 + 7200),  # predicted 1 h: untouched
        rec(20, 20 + 5 * DAY, 20 + DAY),  # predicted 5 days: blended
        rec(30, 30 + 5 * DAY, 30),  # started in its submit pass: untouched
    ]
    data = {"records": records, "metrics": {"mean_wait_s": 1.0}}
    out, changed = eta_drain.with_drain_points(data, weight=0.5, threshold_s=2.5 * DAY, window_s=DAY)
    assert changed == 1
    assert out["records"][1][1] == records[1][1] and out["records"][3][1] == records[3][1]
    drain = 2 * DAY / 1  # the job before it (queued, submitted at 10) + itself, one start in the day
    want = math.exp(0.5 * math.log(5 * DAY + OFFSET_S) + 0.5 * math.log(drain + OFFSET_S)) - OFFSET_S
    assert out["records"][2][1] - 20 == pytest.approx(want)
    assert records[2][1] == 20 + 5 * DAY  # the input is not changed


def test_an_unknown_candidate_names_the_expected_form(tmp_path, capsys) -> None:
    path = tmp_path / "r.json"
    path.write_text('{"records": [], "metrics": {"mean_wait_s": 1.0}}')
    with pytest.raises(SystemExit):
        eta_drain.main(["--records", str(path), "--candidate", "half"])
    assert "w:T_hours:W_days[:level]" in capsys.readouterr().err
