"""The search (apps.sweeps.search): proposals inside their ranges, replayable; pruning where Optuna says."""

from __future__ import annotations

import math

import pytest

from apps.jobs.spec import parse_spec
from apps.sweeps.search import (
    COMPLETE,
    PRUNED,
    RUNNING,
    TrialRecord,
    propose,
    prune_decide,
    trials_to_create,
)

BASE = {"task_name": "s", "command": "yolo train data=demo model=yolov8n.yaml epochs=3 imgsz=64 optimizer=SGD"}
SPACE = {"lr0": {"low": 1e-4, "high": 1e-1, "log": True}, "momentum": {"low": 0.6, "high": 0.98},
         "batch": {"low": 8, "high": 32, "step": 8}, "optimizer": ["SGD", "AdamW", "Adam"]}


def config(method: str = "tpe", trials: int = 30, **extra) -> dict:
    return parse_spec({**BASE, "sweep": {"method": method, "parameters": SPACE, "trials": trials, "seed": 11,
                                         **extra}}).sweep


def objective(params: dict) -> float:
    """A smooth made-up landscape: best near lr0 = 0.01, momentum 0.9, AdamW."""
    return (1 - abs(math.log10(params["lr0"]) + 2) / 3 - abs(params["momentum"] - 0.9)
            + (0.1 if params["optimizer"] == "AdamW" else 0))


def run(cfg: dict, told: int) -> list[TrialRecord]:
    records: list[TrialRecord] = []
    for number in range(told):
        params = propose(cfg, records, number)
        records.append(TrialRecord(number=number, params=params, state=COMPLETE, value=objective(params)))
    return records


def test_tpe_proposes_within_the_ranges_on_their_scale_and_step():
    records = run(config("tpe"), 30)
    for record in records:
        p = record.params
        assert 1e-4 <= p["lr0"] <= 1e-1
        assert 0.6 <= p["momentum"] <= 0.98
        assert p["batch"] in (8, 16, 24, 32)
        assert p["optimizer"] in ("SGD", "AdamW", "Adam")
    # a log range is sampled on its log scale: some proposals in each decade
    decades = {math.floor(math.log10(r.params["lr0"])) for r in records}
    assert decades >= {-4, -3, -2}


def test_tpe_does_better_than_its_random_startup_on_a_smooth_landscape():
    records = run(config("tpe"), 30)
    startup = [r.value for r in records[:10]]
    modelled = [r.value for r in records[10:]]
    assert sum(modelled) / len(modelled) > sum(startup) / len(startup)


def test_a_proposal_is_the_same_when_asked_again_with_the_same_history():
    """What makes a sweep step that died before writing its trial harmless: the next one asks again."""
    cfg = config("tpe")
    records = run(cfg, 12)
    assert propose(cfg, records, 12) == propose(cfg, records, 12)
    assert propose(cfg, records[:5], 5) == records[5].params
    random_cfg = config("random")
    assert propose(random_cfg, [], 3) == propose(random_cfg, [], 3) != propose(random_cfg, [], 4)


def test_running_trials_push_parallel_proposals_apart():
    """TPE's constant liar: a trial still running counts, so two asked at once differ."""
    cfg = config("tpe")
    records = run(cfg, 12)
    first = propose(cfg, records, 12)
    records.append(TrialRecord(number=12, params=first, state=RUNNING))
    assert propose(cfg, records, 13) != first


def test_parallel_is_kept_and_the_total_never_exceeded():
    assert trials_to_create(created=0, active=0, trials=8, parallel=3) == 3
    assert trials_to_create(created=3, active=3, trials=8, parallel=3) == 0
    assert trials_to_create(created=4, active=1, trials=8, parallel=3) == 2
    assert trials_to_create(created=7, active=0, trials=8, parallel=3) == 1
    assert trials_to_create(created=8, active=0, trials=8, parallel=3) == 0


def median_config(startup: int = 2, warmup: int = 0) -> dict:
    return config("random", 10, prune={"method": "median", "startup_trials": startup, "warmup_epochs": warmup})


def done(number: int, curve: list[float]) -> TrialRecord:
    return TrialRecord(number=number, params={"lr0": 0.01, "momentum": 0.9, "batch": 8, "optimizer": "SGD"},
                       state=COMPLETE, value=curve[-1], intermediate=dict(enumerate(curve, start=1)))


def test_a_lagging_trial_is_pruned_at_the_first_epoch_its_best_is_below_the_median():
    cfg = median_config()
    history = [done(0, [0.50, 0.60, 0.70]), done(1, [0.40, 0.50, 0.60])]
    lagging = TrialRecord(number=2, params=history[0].params, state=RUNNING, intermediate={1: 0.45, 2: 0.30})
    # epoch 1: 0.45 is not below the median of 0.50 and 0.40 (0.45); epoch 2: its best, 0.45, is below 0.55
    assert not prune_decide(cfg, history + [lagging], lagging, 1).prune
    decision = prune_decide(cfg, history + [lagging], lagging, 2)
    assert decision.prune
    assert decision.message == ("pruned at epoch 2 (metrics/mAP50-95(B) 0.45 below the median of trials at that "
                                "epoch, 0.55 over 2 completed trial(s))")


def test_nothing_is_pruned_before_enough_trials_completed_nor_in_the_warmup():
    lagging = TrialRecord(number=2, params={}, state=RUNNING, intermediate={1: 0.01, 2: 0.01})
    history = [done(0, [0.5, 0.6, 0.7]), done(1, [0.4, 0.5, 0.6])]
    assert not prune_decide(median_config(startup=3), history + [lagging], lagging, 2).prune
    assert not prune_decide(median_config(warmup=1), history + [lagging], lagging, 1).prune
    assert prune_decide(median_config(warmup=1), history + [lagging], lagging, 2).prune
    pruned_only = [TrialRecord(number=0, params={}, state=PRUNED, intermediate={1: 0.9})]
    assert not prune_decide(median_config(startup=1), pruned_only + [lagging], lagging, 1).prune


def test_asha_keeps_its_rung_values_in_system_attrs_for_the_next_call():
    cfg = config("random", 10, prune={"method": "asha", "min_epochs": 1, "reduction_factor": 2})
    first = TrialRecord(number=0, params={}, state=RUNNING, intermediate={1: 0.8})
    decision = prune_decide(cfg, [first], first, 1)
    assert not decision.prune and decision.system_attrs == {"completed_rung_0": 0.8}
    first.system_attrs = decision.system_attrs
    worse = TrialRecord(number=1, params={}, state=RUNNING, intermediate={1: 0.3})
    decision = prune_decide(cfg, [first, worse], worse, 1)
    assert decision.prune
    assert decision.message == ("pruned at epoch 1 (metrics/mAP50-95(B) 0.3 not in the top 1/2 of the 2 trials "
                                "that reached rung 0)")


@pytest.mark.parametrize("space", [{"weight_decay": {"low": 0, "high": 2e-12}},
                                   {"degrees": {"low": -0.3, "high": 0.3, "step": 0.1}}], ids=["tiny-high", "stepped"])
@pytest.mark.parametrize("method", ["random", "tpe"])
def test_every_proposal_is_a_value_the_trials_submit_takes(space, method):
    """Sampled floats nearer 0 than 1e-12 (a range from 0 to a tiny high; -0.3 + 3 × 0.1 = 5.6e-17 in a
    stepped one) were refused by the trial's own submit ("too close to 0") and counted as failed trials:
    they are proposed as 0, which both ranges hold."""
    cfg = parse_spec({**BASE, "sweep": {"method": method, "parameters": space, "trials": 40, "seed": 11}}).sweep
    [(name, bounds)] = space.items()
    for record in run_flat(cfg, 40):
        value = record.params[name]
        assert value == 0 or abs(value) >= 1e-12, value
        assert bounds["low"] <= value <= bounds["high"]
        parse_spec({"task_name": "t", "train": {"data": "demo", "model": "yolov8n.yaml", name: value}})


def run_flat(cfg: dict, told: int) -> list[TrialRecord]:
    """Like :func:`run`, every trial scoring alike (the space holds none of run's parameters)."""
    records: list[TrialRecord] = []
    for number in range(told):
        params = propose(cfg, records, number)
        records.append(TrialRecord(number=number, params=params, state=COMPLETE, value=float(number % 3)))
    return records
