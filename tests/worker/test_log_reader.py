"""The child's output file becomes the job's log: every line of it, whole characters."""

from __future__ import annotations

import pytest

from worker.executors.base import LogReader


def test_a_last_line_without_a_newline_is_handed_on_once_the_child_has_exited(tmp_path):
    path = tmp_path / "out.log"
    path.write_bytes(b"epoch 1\nsaved best.pt")
    reader = LogReader(path)
    assert reader.read() == "epoch 1\n"  # still running: the line may go on
    assert reader.read() == ""
    with open(path, "ab") as out:
        out.write(b" (3.2 MB)")
    assert reader.read(final=True) == "saved best.pt (3.2 MB)\n"
    assert reader.read(final=True) == ""


def test_the_final_read_takes_everything_left_however_long(tmp_path):
    path = tmp_path / "out.log"
    lines = [f"line {k}" for k in range(50)]
    path.write_text("\n".join(lines))  # no newline after the last one
    reader = LogReader(path)
    reader.CHUNK = 16  # many chunks' worth left when the child exits
    first = reader.read()  # one chunk while it runs
    assert first == "line 0\nline 1\n"
    assert first + reader.read(final=True) == "".join(f"{line}\n" for line in lines)


@pytest.mark.parametrize("before", [4, 6, 10, 11, 15, 19, 20])
def test_a_character_split_between_two_reads_stays_whole(tmp_path, before):
    path = tmp_path / "out.log"
    # A read (1 MiB) ends ``before`` bytes into the line: inside "ö", "ß", "→", "✓" or "🚀".
    text = "x" * ((1 << 20) - before) + "\nGröße → ✓ 🚀\nfertig\n"
    path.write_text(text, encoding="utf-8")
    reader = LogReader(path)
    got = "".join(reader.read() for _ in range(3))
    assert got == text


def test_a_progress_bar_keeps_its_last_state_also_on_the_last_line(tmp_path):
    path = tmp_path / "out.log"
    path.write_bytes(b"  1/10 [10%]\r  5/10 [50%]\r 10/10 [100%]\nval  1/2\r val 2/2")
    reader = LogReader(path)
    assert reader.read(final=True) == " 10/10 [100%]\n val 2/2\n"


def test_the_worker_stores_the_last_line_of_an_exited_child(bob, teams, node, settings, tmp_path):
    from apps.jobs.models import LogChunk
    from tests.jobs.factories import make_job
    from worker import tasks

    settings.JOBS_DIR = tmp_path / "jobs"
    # Running: the worker stores only its current attempt's output (jobs.services.attempt_may_record).
    job = make_job(team=teams["vision"], user=bob, node=node, gpu_indices=[0], state="running")
    runner = tasks.AttemptRunner(job)
    runner.log_path.write_text("Results saved to runs/train\nRuntimeError: the last words, unterminated")
    reader = tasks.LogReader(runner.log_path)
    runner.flush_logs(reader)
    runner.flush_logs(reader, final=True)
    stored = "".join(LogChunk.objects.filter(job=job).order_by("seq").values_list("text", flat=True))
    assert stored == "Results saved to runs/train\nRuntimeError: the last words, unterminated\n"
    assert runner.log_tail[-1] == "RuntimeError: the last words, unterminated"
