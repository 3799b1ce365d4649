"""yoloq's estimated start reads sensibly once part of it has passed (it printed
"likely 2 s ago to 10 s"; new-user trial). Plain functions: no server."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from cli.yoloq import eta_text


def at(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


@pytest.mark.parametrize(("point", "low", "high", "text"), [
    (7260, 5460, 10860, "in 2.0 h (likely in 1.5 h to 3.0 h)"),
    (1860, -5, 7230, "in 31 min (likely within 2.0 h)"),
    (-3, -10, 660, "any moment (likely within 11 min)"),
    (-3, -60, -1, "any moment"),
    (1860, None, None, "in 31 min"),
    (None, None, None, "-"),
    # Both ends of the range read alike once rounded: not "likely in 2 min to 2 min" (trial26).
    (125, 100, 130, "in 2 min"),
    (200, 100, 130, "in 3 min (likely in 2 min)"),
])
def test_the_estimated_start_reads_as_a_sentence(point, low, high, text):
    entry = {"estimated_start_at": point and at(point), "estimated_start_low_at": low and at(low),
             "estimated_start_high_at": high and at(high)}
    assert eta_text(entry) == text
    assert "ago" not in eta_text(entry)
