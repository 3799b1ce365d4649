"""The ``sweep:`` block: its grid expands exactly, every refusal names its field."""

from __future__ import annotations

import pytest

from apps.jobs.spec import SpecError, parse_spec
from apps.jobs.spec_sweep import DEFAULT_METRIC, grid_expand

BASE = {"task_name": "lr-sweep", "command": "yolo train data=demo model=yolov8n.yaml epochs=3 imgsz=64 optimizer=SGD"}


def sweep_of(**sweep):
    return parse_spec({**BASE, "sweep": sweep}).sweep


def refusal(**sweep) -> dict[str, str]:
    with pytest.raises(SpecError) as caught:
        parse_spec({**BASE, "sweep": sweep})
    return caught.value.errors


def test_a_grid_expands_to_every_combination_once_first_parameter_slowest():
    config = sweep_of(method="grid", parameters={"lr0": [0.01, 0.001], "batch": [8, 16, 32]})
    assert config["trials"] == 6
    assert grid_expand(config["parameters"]) == [
        {"lr0": 0.01, "batch": 8}, {"lr0": 0.01, "batch": 16}, {"lr0": 0.01, "batch": 32},
        {"lr0": 0.001, "batch": 8}, {"lr0": 0.001, "batch": 16}, {"lr0": 0.001, "batch": 32},
    ]


def test_a_grid_expands_stepped_ranges_exactly_with_their_ends():
    config = sweep_of(method="grid", parameters={"imgsz": {"low": 64, "high": 128, "step": 32},
                                                 "momentum": {"low": 0.1, "high": 0.3, "step": 0.1},
                                                 "cos_lr": [True, False]})
    rows = grid_expand(config["parameters"])
    assert len(rows) == config["trials"] == 3 * 3 * 2
    assert sorted({r["imgsz"] for r in rows}) == [64, 96, 128]
    assert sorted({r["momentum"] for r in rows}) == [0.1, 0.2, 0.3]  # no 0.30000000000000004
    assert len({tuple(r.values()) for r in rows}) == len(rows)


def test_a_grid_with_a_trial_count_that_is_not_its_size_is_refused():
    assert "sweep.trials" in refusal(method="grid", parameters={"lr0": [0.01, 0.001]}, trials=3)
    assert sweep_of(method="grid", parameters={"lr0": [0.01, 0.001]}, trials=2)["trials"] == 2


def test_a_grid_needs_choices_or_a_step():
    assert refusal(method="grid", parameters={"lr0": {"low": 0.001, "high": 0.1}}) == {
        "sweep.parameters.lr0": "a grid needs choices or a range with a step (e.g. {low: 0.001, high: 0.01, step: 0.003})"}


def test_defaults_tpe_the_issue_metric_two_at_once_no_pruning():
    config = sweep_of(parameters={"lr0": {"low": "1e-4", "high": "1e-1", "log": True}}, trials=8)
    assert config == {"method": "tpe", "trials": 8, "parallel": 2, "metric": DEFAULT_METRIC, "prune": None,
                      "seed": None, "parameters": {"lr0": {"type": "float", "low": 1e-4, "high": 0.1, "log": True,
                                                           "step": None}}}


def test_ranges_take_the_arguments_type_and_choices_their_parsed_values():
    config = sweep_of(parameters={"batch": {"low": 8, "high": 32, "step": 8}, "optimizer": {"choices": ["SGD", "AdamW"]},
                                  "cos_lr": ["true", False]}, trials=4, prune="median")
    assert config["parameters"]["batch"] == {"type": "int", "low": 8, "high": 32, "log": False, "step": 8}
    assert config["parameters"]["optimizer"] == {"type": "categorical", "choices": ["SGD", "AdamW"]}
    assert config["parameters"]["cos_lr"] == {"type": "categorical", "choices": [True, False]}
    assert config["prune"] == {"method": "median", "startup_trials": 2, "warmup_epochs": 1}


@pytest.mark.parametrize(("sweep", "field", "words"), [
    ({"parameters": {"lr0": {"low": -1, "high": 0.1}}, "trials": 2}, "sweep.parameters.lr0.low", "between 0 and 10"),
    ({"parameters": {"lr0": {"low": 0.1, "high": 0.01}}, "trials": 2}, "sweep.parameters.lr0.high", "greater than low"),
    ({"parameters": {"lr0": {"low": 0, "high": 0.1, "log": True}}, "trials": 2}, "sweep.parameters.lr0.low", "log"),
    ({"parameters": {"lr0": {"high": 0.1}}, "trials": 2}, "sweep.parameters.lr0.low", "required"),
    ({"parameters": {"lr0": {"low": 0.1, "high": 1, "stride": 2}}, "trials": 2}, "sweep.parameters.lr0.stride", "range field"),
    ({"parameters": {"batch": [8, "many"]}, "trials": 2}, "sweep.parameters.batch[1]", "must be a number"),
    ({"parameters": {"batch": [8, 8]}, "trials": 2}, "sweep.parameters.batch[1]", "twice"),
    ({"parameters": {"optimizer": {"low": 1, "high": 2}}, "trials": 2}, "sweep.parameters.optimizer.low", "one of"),
    ({"parameters": {"cos_lr": {"low": 0, "high": 1}}, "trials": 2}, "sweep.parameters.cos_lr.low", "true or false"),
    ({"parameters": {"model": {"low": 1, "high": 2}}, "trials": 2}, "sweep.parameters.model.low", "string"),
    ({"parameters": {"flux": [1, 2]}, "trials": 2}, "sweep.parameters.flux", "not an allowed training argument"),
    ({"parameters": {"device": ["0", "1"]}, "trials": 2}, "sweep.parameters.device", "scheduler"),
    ({"parameters": {"data": ["a", "b"]}, "trials": 2}, "sweep.parameters.data", "same dataset"),
    ({"parameters": {"lr0": 0.1}, "trials": 2}, "sweep.parameters.lr0", "list of choices or a range"),
    ({"parameters": {}, "trials": 2}, "sweep.parameters", "required"),
    ({"parameters": {"lr0": [0.1, 0.2]}}, "sweep.trials", "required"),
    ({"parameters": {"lr0": [0.1, 0.2]}, "trials": 0}, "sweep.trials", "between 1 and"),
    ({"parameters": {"lr0": [0.1, 0.2]}, "trials": 2, "parallel": "two"}, "sweep.parallel", "whole number"),
    ({"parameters": {"lr0": [0.1, 0.2]}, "trials": 2, "method": "bayes"}, "sweep.method", "grid, random, tpe"),
    ({"parameters": {"lr0": [0.1, 0.2]}, "trials": 2, "metric": "val/box_loss"}, "sweep.metric", "grows with quality"),
    ({"parameters": {"lr0": [0.1, 0.2]}, "trials": 2, "prune": "hyperband"}, "sweep.prune", "median, asha"),
    ({"parameters": {"lr0": [0.1, 0.2]}, "trials": 2, "prune": {"method": "asha", "reduction_factor": 1}},
     "sweep.prune.reduction_factor", "between 2 and"),
    ({"parameters": {"lr0": [0.1, 0.2]}, "trials": 2, "prune": {"method": "median", "patience": 3}},
     "sweep.prune.patience", "not an option of median"),
    ({"parameters": {"lr0": [0.1, 0.2]}, "trials": 2, "budget": 3}, "sweep.budget", "not a sweep field"),
    # trial26: a search space of one point, sampled 3 times, was 3 trainings of the same configuration.
    ({"parameters": {"lr0": [0.01]}, "trials": 3, "method": "random"}, "sweep.trials", "one point"),
    ({"parameters": {"lr0": [0.01], "batch": [8]}, "trials": 2}, "sweep.trials", "lr0=0.01, batch=8"),
])
def test_every_refusal_names_its_field(sweep, field, words):
    errors = refusal(**sweep)
    assert field in errors, errors
    assert words in errors[field], errors[field]


def test_a_space_of_one_point_is_not_claimed_when_it_is_one_only_because_entries_were_refused():
    """lr0 {low: 0.1, high: 0.01} and mosaic [0, 1.5]: both refused, and sweep.trials said "the search
    space has one point (mosaic=0.0)" — the space of what was left, not of what was typed; the portal's
    Sweep tab showed it at Trials too (team adoption trial 30)."""
    errors = refusal(parameters={"lr0": {"low": 0.1, "high": 0.01}, "mosaic": [0, 1.5]}, trials=2, method="random")
    assert set(errors) == {"sweep.parameters.lr0.high", "sweep.parameters.mosaic[1]"}, errors
    # Left with one point by what was given, it still is refused.
    assert "one point" in refusal(parameters={"mosaic": [0.5]}, trials=2, method="random")["sweep.trials"]


def test_only_a_training_spec_is_swept_and_it_does_not_export_after_each_trial():
    with pytest.raises(SpecError) as caught:
        parse_spec({"task_name": "v", "command": "yolo val model=m:v1 data=demo", "sweep": {"trials": 1}})
    assert "sweep" in caught.value.errors
    with pytest.raises(SpecError) as caught:
        parse_spec({**BASE, "export": ["onnx"], "sweep": {"parameters": {"lr0": [0.1]}, "trials": 1}})
    assert "export" in caught.value.errors


def test_two_sweeps_that_differ_only_in_their_search_are_not_duplicates():
    a = parse_spec({**BASE, "sweep": {"parameters": {"lr0": [0.1, 0.2]}, "trials": 2}})
    b = parse_spec({**BASE, "sweep": {"parameters": {"lr0": [0.1, 0.3]}, "trials": 2}})
    plain = parse_spec(BASE)
    assert len({a.fingerprint(), b.fingerprint(), plain.fingerprint()}) == 3


def test_lr0_is_not_swept_where_ultralytics_would_ignore_it():
    """optimizer=auto (Ultralytics' default) chooses lr0 and momentum itself."""
    document = {**BASE, "command": BASE["command"].replace(" optimizer=SGD", "")}
    with pytest.raises(SpecError) as caught:
        parse_spec({**document, "sweep": {"parameters": {"lr0": [0.01, 0.001], "batch": [8, 16]}, "trials": 2}})
    assert list(caught.value.errors) == ["sweep.parameters.lr0"]
    assert "optimizer=auto" in caught.value.errors["sweep.parameters.lr0"]
    swept = parse_spec({**document, "sweep": {"parameters": {"lr0": [0.01], "optimizer": ["SGD", "AdamW"]},
                                              "trials": 2}})
    assert swept.sweep["parameters"]["optimizer"]["choices"] == ["SGD", "AdamW"]


@pytest.mark.parametrize(("name", "low", "high"), [("imgsz", 64, 128), ("momentum", 0.1, 0.3)])
def test_a_step_past_a_floats_range_is_refused_naming_it(name, low, high):
    """``step: 10**400`` (a JSON integer of 401 digits): math.isfinite() of it raised OverflowError,
    a 500 at submit (review27). It is larger than any range."""
    errors = refusal(method="grid", parameters={name: {"low": low, "high": high, "step": 10**400}})
    assert errors == {f"sweep.parameters.{name}.step": f"is larger than the range ({high - low:g})"}


TOO_CLOSE = "is too close to 0 (a grid keeps 12 decimals): give 0 or at least 1e-12 in size; got "


@pytest.mark.parametrize(("parameters", "field", "given"), [
    # trial28: accepted, and every trial trained with lr0=5e-324: no learning rate at all.
    ({"lr0": {"low": 5e-324, "high": 1e-3, "log": True}}, "sweep.parameters.lr0.low", "5e-324"),
    ({"lr0": {"low": 1e-13, "high": 0.1, "log": True}}, "sweep.parameters.lr0.low", "1e-13"),
    ({"lr0": [0.01, 5e-324]}, "sweep.parameters.lr0[1]", "5e-324"),
    ({"degrees": {"low": -1e-300, "high": 10}}, "sweep.parameters.degrees.low", "-1e-300"),
])
def test_a_value_that_rounds_to_zero_is_refused_naming_it(parameters, field, given):
    assert refusal(parameters=parameters, trials=1) == {field: TOO_CLOSE + given}


def test_a_float_step_that_rounds_to_zero_is_refused_naming_it():
    """A grid keeps 12 decimals: a step of 1e-13 made its values equal, trials of one configuration."""
    assert refusal(method="grid", parameters={"lr0": {"low": 1e-12, "high": 2e-12, "step": 1e-13}}) == {
        "sweep.parameters.lr0.step": "must be at least 1e-12 (a grid keeps 12 decimals), got 1e-13"}


def test_the_smallest_value_and_step_are_taken():
    config = sweep_of(method="grid", parameters={"lr0": {"low": 1e-12, "high": 3e-12, "step": 1e-12}})
    assert [row["lr0"] for row in grid_expand(config["parameters"])] == [1e-12, 2e-12, 3e-12]
    assert sweep_of(parameters={"lr0": [0, 0.01]}, trials=2)["parameters"]["lr0"]["choices"] == [0.0, 0.01]
