"""yoloq's number options are checked before anything is asked of the server (new-user trial 28):
``wait --timeout nan`` or ``inf`` waited forever, ``--timeout -1`` said "still queued after -1 s",
and a bad ``--interval`` ended in time.sleep's traceback."""

from __future__ import annotations

import pytest

from cli import yoloq


@pytest.fixture(autouse=True)
def no_login(config):
    """No server: a value that got past the parser would end in "not logged in" (exit 1)."""


def refusal(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as stopped:
        yoloq.main(list(argv))
    assert stopped.value.code == 2  # a usage error, apart from every exit status `wait` gives a job's end
    return capsys.readouterr().err


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400", "-1", "-0.5", "ten", ""])
def test_wait_refuses_a_timeout_that_is_no_finite_number_of_seconds(capsys, value):
    err = refusal(capsys, "wait", "abcd1234", f"--timeout={value}")
    assert f"argument --timeout: must be a number of seconds, 0 or more; got {value!r}" in err


@pytest.mark.parametrize(
    ("command", "value"),
    [
        (("wait", "abcd1234"), "nan"),
        (("wait", "abcd1234"), "0"),
        (("wait", "abcd1234"), "-1"),
        (("logs", "-f", "abcd1234"), "inf"),
        (("logs", "-f", "abcd1234"), "0"),
        (("logs", "-f", "abcd1234"), "1e10"),
    ],
)
def test_a_poll_interval_must_be_a_sensible_number_of_seconds(capsys, command, value):
    err = refusal(capsys, *command, f"--interval={value}")
    assert f"argument --interval: must be a number of seconds from 0.1 to 3600; got {value!r}" in err


@pytest.mark.parametrize(("text", "seconds"), [("0", 0.0), ("0.3", 0.3), ("90", 90.0), ("1e6", 1e6)])
def test_a_timeout_of_zero_or_more_seconds_is_taken(text, seconds):
    assert yoloq.parser().parse_args(["wait", "abcd1234", "--timeout", text]).timeout == seconds
