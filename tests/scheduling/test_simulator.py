"""The trace simulator: parsing, load scaling, metrics and the lower bound (pure, small inputs)."""

from __future__ import annotations

import json

import pytest

from apps.scheduling.policy import PolicyConfig
from apps.scheduling.simulator import (
    TraceTask,
    jain,
    load_nodes,
    load_trace,
    offered_load,
    rescale,
    run_simulation,
    simulate_policy,
    srpt_lower_bound,
)

POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
)


@pytest.fixture
def trace(tmp_path):
    rows = [
        "p0,8000,16384,1,1000,,LS,Running,0,3600,0",
        "p1,4000,8192,1,500,,BE,Succeeded,10,1810,10",
        "p2,4000,8192,1,500,,BE,Succeeded,20,1820,20",
        "p3,32000,65536,8,1000,,Burstable,Succeeded,30,7230,30",
        "p4,4000,8192,2,1000,G2|T4,LS,Failed,40,640,40",
        "p5,4000,8192,1,1000,,LS,Pending,50,900,",
        "p6,4000,8192,0,0,,LS,Running,60,900,60",
        "p7,4000,8192,1,1000,A10,Guaranteed,Running,70,700,70",
    ]
    path = tmp_path / "pods.csv"
    path.write_text(POD_HEADER + "\n".join(rows) + "\n")
    return str(path)


def test_trace_parsing_skips_never_scheduled_and_cpu_only_tasks(trace) -> None:
    tasks, skipped = load_trace(trace)
    assert skipped == {"never_scheduled": 1, "cpu_only": 1}
    by_name = {t.name: t for t in tasks}
    assert by_name["p1"].gpus == 0.5 and by_name["p3"].gpus == 8.0
    assert by_name["p4"].gpu_models == ("G2", "T4") and by_name["p4"].duration == 600


def test_nxg_and_csv_nodes(tmp_path) -> None:
    nodes = load_nodes("3x8")
    assert len(nodes) == 3 and all(len(n.gpus) == 8 for n in nodes)
    csv_path = tmp_path / "nodes.csv"
    csv_path.write_text("sn,cpu_milli,memory_mib,gpu,model\na,64000,262144,2,P100\nb,96000,393216,0,\n")
    (node,) = load_nodes(str(csv_path))
    assert node.name == "a" and [g.model for g in node.gpus] == ["P100", "P100"]


def test_rescale_hits_the_requested_load() -> None:
    tasks = [TraceTask(f"t{i}", i * 100.0, 500.0, 1.0, (), 0, 0, "LS") for i in range(50)]
    assert offered_load(rescale(tasks, 4.0, 0.9), 4.0) == pytest.approx(0.9)


def test_srpt_bound_on_one_job_is_its_size_over_the_pool() -> None:
    assert srpt_lower_bound([TraceTask("a", 0.0, 100.0, 2.0, (), 0, 0, "")], 4.0) == pytest.approx(50.0)


def test_srpt_bound_runs_the_short_job_first() -> None:
    tasks = [TraceTask("long", 0.0, 100.0, 1.0, (), 0, 0, ""), TraceTask("short", 0.0, 10.0, 1.0, (), 0, 0, "")]
    assert srpt_lower_bound(tasks, 1.0) == pytest.approx((10 + 110) / 2)


def test_jain_index() -> None:
    assert jain([1, 1, 1]) == pytest.approx(1.0)
    assert jain([1, 0, 0, 0]) == pytest.approx(0.25)


def test_run_simulation_reports_every_metric(trace, tmp_path) -> None:
    plot = tmp_path / "plot.png"
    result = run_simulation(trace, "1x8", ("fifo", "fair"), seed=3, load=0.9, plot_path=str(plot))
    json.dumps(result)
    assert plot.stat().st_size > 0
    assert result["lower_bound"]["mean_jct_s"] > 0
    for name in ("fifo", "fair"):
        m = result["policies"][name]
        for key in (
            "jobs",
            "mean_wait_s",
            "p50_wait_s",
            "p95_wait_s",
            "p99_wait_s",
            "max_wait_s",
            "mean_jct_s",
            "utilization",
            "jain_fairness",
            "eta_mae_s",
            "preemptions",
        ):
            assert key in m
        assert m["rejected"] == 1  # p7 asks for an A10 the G2 cluster does not have
        assert m["jobs"] == 5 and m["never_started"] == 0
        assert m["mean_jct_s"] >= result["lower_bound"]["mean_jct_s"] - 1e-6
        assert 0 < m["utilization"] <= 1


def test_simulation_is_deterministic(trace) -> None:
    assert run_simulation(trace, "1x4", ("fair",), seed=5) == run_simulation(trace, "1x4", ("fair",), seed=5)


def test_a_victim_holds_all_its_gpus_until_it_stops() -> None:
    """A job started on a gracefully stopping victim's GPU makes no progress before the victim stops.

    One 8-GPU node. A low 8-GPU job has run 1,000 s (epochs of 600 s) when an urgent and a
    high 1-GPU job arrive: the urgent one preempts it, the victim stops at its epoch end
    (1,200 s), and the high one is placed on another of the victim's GPUs in the same pass.
    Both must wait those 200 s (they used to: only the preemptor did, the high job ran on a
    GPU the victim still held).
    """
    nodes = load_nodes("1x8")
    tasks = [
        TraceTask("victim", 0.0, 100_000.0, 8.0, (), 8000, 8192, "BE"),
        TraceTask("urgent", 1000.0, 1000.0, 1.0, (), 1000, 1024, "Guaranteed"),
        TraceTask("high", 1000.0, 1000.0, 1.0, (), 1000, 1024, "LS"),
    ]
    owners = [("team-a", "ann"), ("team-b", "bob"), ("team-c", "cat")]
    config = PolicyConfig(policy="fair", user_gpu_hours_per_day=None, eta_scenarios=0, preempt_grace_s=900.0)

    metrics = simulate_policy(tasks, owners, nodes, config, seed=1, walltime_sigma=0.0)

    assert metrics["preemptions"] == 1
    assert metrics["_waits"][:2] == pytest.approx([200.0, 200.0])


def _one_node_replay(tasks: list[TraceTask], policy: str) -> dict:
    """Replay ``tasks`` (one user) on one node of 2 G2 GPUs, 32 cores; exact walltime estimates."""
    config = PolicyConfig(policy=policy, user_gpu_hours_per_day=None, eta_scenarios=0)
    owners = [("team-a", "ann")] * len(tasks)
    return simulate_policy(tasks, owners, load_nodes("1x2"), config, seed=1, walltime_sigma=0.0)


def test_gpus_left_idle_while_a_waiting_job_fits_them_are_counted() -> None:
    """FIFO keeps a free GPU idle behind a 2-GPU head job while a 1-GPU job that fits it waits.

    A (1 GPU) runs 0–1,000 s; B (2 GPUs) arrives at 100 s and waits for A; C (1 GPU) arrives at
    200 s, fits the free GPU, but FIFO does not let it pass B: 1 GPU idle while a job could use
    it for 800 s. From 100 to 200 s only B waits and does not fit: not counted. D at 2,000 s
    ends the arrival window (2 GPUs × 2,000 s); the replay ends when D does, at 2,010 s.
    """
    tasks = [
        TraceTask("a", 0.0, 1000.0, 1.0, (), 1000, 1024, "LS"),
        TraceTask("b", 100.0, 500.0, 2.0, (), 1000, 1024, "LS"),
        TraceTask("c", 200.0, 100.0, 1.0, (), 1000, 1024, "LS"),
        TraceTask("d", 2000.0, 10.0, 1.0, (), 1000, 1024, "LS"),
    ]
    m = _one_node_replay(tasks, "fifo")

    assert m["idle_while_waiting_gpu_hours"] == pytest.approx(800 / 3600)
    assert m["idle_while_waiting_fraction"] == pytest.approx(800 / (2 * 2000))
    assert m["idle_while_waiting_gpu_hours_all"] == pytest.approx(800 / 3600)
    assert m["idle_while_waiting_fraction_all"] == pytest.approx(800 / (2 * 2010))
    assert m["held_for_reservation_gpu_hours"] == 0.0 and m["short_of_cpu_or_ram_gpu_hours"] == 0.0
    assert m["kept_for_reservation_gpu_hours"] == 0.0  # FIFO makes no reservations
    # busy: A 1,000 + B 2 × 500 + C 100 (+ D 10 after the window)
    assert m["idle_gpu_hours"] == pytest.approx((2 * 2000 - 2100) / 3600)
    # nothing waits 0–100 s (1 GPU free), 1,500–1,600 s (1) and 1,600–2,000 s (2); D's 10 s after
    assert m["idle_no_job_waiting_gpu_hours"] == pytest.approx(1000 / 3600)
    assert m["idle_no_job_waiting_gpu_hours_all"] == pytest.approx(1010 / 3600)
    assert m["utilization_all"] == pytest.approx(2110 / (2 * 2010))


def test_a_free_gpu_kept_for_a_reservation_counts_as_held_not_idle_while_waiting() -> None:
    """The fair policy reserves the node for B (2 GPUs at 1,000 s) and keeps C (1 GPU, 5,000 s,
    would delay B) off the free GPU: 800 s held for a reservation, none idle while waiting.

    From 100 to 200 s only B waits: the free GPU is kept for its reservation with nothing
    else to backfill (100 s). Nothing waits 0–100 s (1 GPU), 1,500–6,500 s (C runs: 1) and
    6,500–7,000 s (2): 6,100 GPU-s.
    """
    tasks = [
        TraceTask("a", 0.0, 1000.0, 1.0, (), 1000, 1024, "LS"),
        TraceTask("b", 100.0, 500.0, 2.0, (), 1000, 1024, "LS"),
        TraceTask("c", 200.0, 5000.0, 1.0, (), 1000, 1024, "LS"),
        TraceTask("d", 7000.0, 10.0, 1.0, (), 1000, 1024, "LS"),
    ]
    m = _one_node_replay(tasks, "fair")

    assert m["held_for_reservation_gpu_hours"] == pytest.approx(800 / 3600)
    assert m["held_for_reservation_fraction"] == pytest.approx(800 / (2 * 7000))
    assert m["idle_while_waiting_gpu_hours"] == 0.0 and m["short_of_cpu_or_ram_gpu_hours"] == 0.0
    assert m["kept_for_reservation_gpu_hours"] == pytest.approx(100 / 3600)
    assert m["idle_no_job_waiting_gpu_hours"] == pytest.approx(6100 / 3600)


def test_a_free_gpu_on_a_node_out_of_cpu_counts_as_short_of_cpu() -> None:
    """A holds 1 GPU and 30 of the node's 32 cores for 1,000 s; B (1 GPU, 4 cores) arrives at
    100 s: its GPU fits, its CPU does not, so the free GPU is short of CPU for 900 s."""
    tasks = [
        TraceTask("a", 0.0, 1000.0, 1.0, (), 30000, 1024, "LS"),
        TraceTask("b", 100.0, 500.0, 1.0, (), 4000, 1024, "LS"),
        TraceTask("d", 2000.0, 10.0, 1.0, (), 1000, 1024, "LS"),
    ]
    m = _one_node_replay(tasks, "fair")

    assert m["short_of_cpu_or_ram_gpu_hours"] == pytest.approx(900 / 3600)
    assert m["idle_while_waiting_gpu_hours"] == 0.0 and m["held_for_reservation_gpu_hours"] == 0.0
