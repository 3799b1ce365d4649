"""bench/why_waited.py: the instrumented replay observes the real planner without changing a start."""

from __future__ import annotations

import argparse

import pytest

import apps.scheduling.simulator as sim

why = pytest.importorskip("bench.why_waited")
eta_calibration = pytest.importorskip("bench.eta_calibration")

DAY = 86400.0
HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"


def write_trace(path, rows) -> None:
    lines = [HEADER]
    for name, gpus, submit, duration in rows:
        lines.append(f"{name},1000,1024,{gpus},1000,,LS,Running,{submit},{submit + duration},{submit}")
    path.write_text("\n".join(lines) + "\n")


def setup(tmp_path) -> dict:
    """One 8-GPU node: four 1-GPU jobs of 10 days hold half of it, a whole-node job comes next
    (it can start only when they end: a reservation), then 1-GPU jobs of an hour backfill beside it."""
    rows = [(f"long-{k}", 1, k, 10 * DAY) for k in range(4)]
    rows.append(("big", 8, 100, DAY))
    rows += [(f"short-{k}", 1, 200 + 3600 * k, 3600) for k in range(6)]
    rows.append(("last", 1, 20 * DAY, 3600))
    path = tmp_path / "trace.csv"
    write_trace(path, rows)
    tasks, _ = sim.load_trace(str(path))
    return {
        "trace": str(path),
        "nodes": "1x8",
        "load": sim.offered_load(tasks, 8.0),  # rescale leaves the times as written
        "seed": 3,
        "max_tasks": None,
        "scenarios": 3,
        "eta_head": 128,
        "after_budget_stretch": False,
        "below_head_stretch": True,
        "below_head_load_max": 0.9,
    }


def test_the_whole_node_job_is_followed_pass_by_pass_and_no_start_moves(tmp_path) -> None:
    replay = setup(tmp_path)
    plain = eta_calibration.replay(argparse.Namespace(**replay))["records"]
    big = next(r for r in plain if r[6] == 8)
    assert big[4] - big[0] >= 7 * DAY  # it waits for the 10-day jobs

    data = why.trace(replay, set(why.long_waiters(plain, 7 * DAY)))
    assert data["starts"] == sorted((r[4], r[0], float(r[6])) for r in plain)  # the instrumentation moves no start
    assert list(data["jobs"]) == ["big"]
    job = data["jobs"]["big"]
    assert job["first_start"] == big[4]
    assert job["passes"] and all(p[0] < job["first_start"] for p in job["passes"])
    assert {p[3] for p in job["passes"]} == {"reserved"}  # the only blocked job: it holds the reservation
    assert all(p[4] >= p[0] for p in job["passes"])  # the reservation's time is never in the past
    # The six short jobs started on its node while it waited (the four long ones before it came).
    assert sorted(p[1] for p in job["passed_by"]) == [f"short-{k}" for k in range(6)]
    # ranked ahead of it (an hour of one GPU: a higher size factor than its 8-GPU day), in its class
    assert {(p[2], p[3], p[4]) for p in job["passed_by"]} == {(1.0, "high", True)}
    # Its ETA re-asked at most once a day of replay time, at the passes there were: at its submit, then when
    # the first 10-day job ended (no pass in between); each range is a range.
    assert [e[0] for e in job["etas"]] == [100.0, 10 * DAY]
    assert all(e[2] <= e[1] <= e[3] for e in job["etas"])
    spent = why.states(job)
    assert sum(spent.values()) == pytest.approx(job["first_start"] - job["passes"][0][0])
    assert why.cause(job) == "held a reservation most of the wait"


def test_states_split_the_wait_between_passes() -> None:
    job = {
        "submit": 0.0,
        "first_start": 10 * DAY,
        "preempted": 0,
        "passes": [
            [0.0, 5, 9, "resources", None, 2],  # below two reserved jobs for 6 days
            [6 * DAY, 2, 9, "resources", None, 0],  # first blocked job, no reservation: 1 day
            [7 * DAY, 1, 9, "reserved", 9 * DAY, 0],  # reserved for the last 3 days
        ],
    }
    assert why.states(job) == {
        "blocked, no reservation": 6 * DAY,
        "blocked, none reserved ahead": DAY,
        "reserved": 3 * DAY,
    }
    job["passed_by"] = [
        [DAY, "a", 1.0, "low", True],
        [2 * DAY, "b", 1.0, "low", False],
        [3 * DAY, "c", 8.0, "high", True],
    ]
    job["passes"][2][4] = 7 * DAY  # due at the pass: the jobs it counts on are past their estimates
    assert why.states(job)["reserved, due now"] == 3 * DAY
    assert why.cause(job) == "outranked: starts on its GPUs went to jobs ranked ahead"
    job["passed_by"][2][4] = False
    assert why.cause(job) == "passed by backfill: starts on its GPUs went to jobs ranked behind"
    job["preempted"] = 1
    assert why.cause(job) == "preempted and requeued"
