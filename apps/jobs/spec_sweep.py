"""The ``sweep:`` block of a training spec: a hyperparameter search whose trials are train jobs.

Pure parsing, like :mod:`apps.jobs.spec` (which calls :func:`sweep_parse` with its own
argument parsers, so the two modules do not import each other). Every error names its
field path: ``sweep.parameters.lr0.low``, ``sweep.parameters.batch[2]``, ``sweep.trials``.

.. code-block:: yaml

    sweep:
      method: tpe                # grid | random | tpe (Optuna's TPE sampler); default tpe
      parameters:
        lr0: {low: 1.0e-4, high: 1.0e-1, log: true}   # a range (float or int, by the argument)
        momentum: {low: 0.6, high: 0.98}
        imgsz: {low: 64, high: 128, step: 32}         # a stepped range (a grid expands it)
        optimizer: [SGD, AdamW]                       # choices (or {choices: [...]})
      trials: 8                  # grid: the number of combinations (may be left out)
      parallel: 2                # at most this many trials queued or running at once
      metric: metrics/mAP50-95(B)   # maximised; by default the task's own figure (TASK_DEFAULT_METRICS)
      prune: median              # median | asha | a mapping with options; default none
      seed: 7                    # optional; the platform draws one at submit otherwise

The normalised form (``JobSpec.sweep``) is plain JSON: ``parameters`` maps each name to
``{"type": "float"|"int"|"categorical", "low", "high", "log", "step", "choices"}``.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable
from typing import Any

from apps.core.values import bool_parse

METHODS = ("grid", "random", "tpe")
PRUNERS = ("median", "asha")
SWEEP_KEYS = ("method", "parameters", "trials", "parallel", "metric", "prune", "seed")
DEFAULT_METRIC = "metrics/mAP50-95(B)"
MAX_TRIALS = 500
MAX_PARAMETERS = 20
MAX_CHOICES = 100
DEFAULT_PARALLEL = 2
# A grid keeps its float values to DECIMALS decimals (grid_values): a value or a step nearer 0 than
# SMALLEST rounds to 0 there. A range from 5e-324 trained every trial with lr0 5e-324, no learning
# rate at all (trial28); spec._float refuses such a value in every training argument.
DECIMALS = 12
SMALLEST = 10.0**-DECIMALS
# Arguments a sweep may not vary: what every trial must share for their metrics to compare.
NOT_SWEPT = {
    "data": "every trial trains on the same dataset, or their metrics do not compare (one sweep per dataset)",
    "val": "trials are judged on their validation metrics; validation must stay on",
    "time": "use epochs: a time limit makes trials stop at different epochs",
    "save_period": "the platform keeps its own checkpoints",
    "verbose": "changes the log, not the training",
}
# Metrics Ultralytics reports per epoch that grow with quality (losses shrink: not maximisable).
METRIC_PATTERN = re.compile(r"metrics/[A-Za-z0-9_.()-]{1,60}|fitness")
# What each task's validator reports per epoch (Ultralytics 8.4 ``DetMetrics.keys`` and its
# subclasses, ``ClassifyMetrics.keys``), besides ``fitness``. A sweep judged on a name its task
# never reports would run every trial and rank none (trial21).
_BOX_METRICS = ("metrics/precision(B)", "metrics/recall(B)", "metrics/mAP50(B)", "metrics/mAP50-95(B)")
TASK_METRICS: dict[str, tuple[str, ...]] = {
    "detect": _BOX_METRICS,
    "obb": _BOX_METRICS,
    "segment": (*_BOX_METRICS, *(k.replace("(B)", "(M)") for k in _BOX_METRICS)),
    "pose": (*_BOX_METRICS, *(k.replace("(B)", "(P)") for k in _BOX_METRICS)),
    "classify": ("metrics/accuracy_top1", "metrics/accuracy_top5"),
}


# The metric a sweep maximises when its spec names none: the task's own figure (a segment engineer
# means the masks, not the boxes around them); a task not known here (weights whose task the
# registry could not read) keeps the box figure.
TASK_DEFAULT_METRICS = {"detect": DEFAULT_METRIC, "obb": DEFAULT_METRIC, "segment": "metrics/mAP50-95(M)",
                        "pose": "metrics/mAP50-95(P)", "classify": "metrics/accuracy_top1"}


def sweep_default_metric(task: str) -> str:
    """What a sweep of ``task`` trials maximises when its spec gives no ``metric``."""
    return TASK_DEFAULT_METRICS.get(task, DEFAULT_METRIC)


def sweep_metric_problem(metric: str, task: str) -> str:
    """Why ``metric`` cannot judge trials of ``task`` (``""``: it can). An empty task (weights
    whose task is unknown) allows any name some task reports."""
    if metric == "fitness":
        return ""
    reported = TASK_METRICS.get(task) or tuple(dict.fromkeys(k for keys in TASK_METRICS.values() for k in keys))
    if metric in reported:
        return ""
    what = f"a {task} training reports" if task in TASK_METRICS else "trainings report"
    return (f"{metric} is not a metric {what}, so no trial would ever have a value; "
            f"one of: {', '.join(reported)}, fitness")


def _int_in(value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str) and value.isascii() and re.fullmatch(r"[0-9]+", value.strip()):
            value = int(value)
        elif isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise ValueError(f"must be a whole number, got {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"must be between {lo} and {hi}, got {value}")
    return value


def _number(parser: Callable[[Any], Any], value: Any) -> int | float:
    """A range bound parsed by the argument's own parser; refused if the argument is not numeric."""
    parsed = parser(value)
    if isinstance(parsed, bool) or not isinstance(parsed, (int, float)):
        raise TypeError
    return parsed


def _choices(name: str, value: Any, parser: Callable[[Any], Any], path: str, errors: dict[str, str]) -> dict | None:
    if not isinstance(value, list) or not value:
        errors[path] = "must be a non-empty list of values"
        return None
    if len(value) > MAX_CHOICES:
        errors[path] = f"has {len(value)} choices; at most {MAX_CHOICES}"
        return None
    choices: list[Any] = []
    for index, item in enumerate(value):
        try:
            parsed = parser(item)
        except ValueError as exc:
            errors[f"{path}[{index}]"] = str(exc)
            continue
        if parsed in choices:
            errors[f"{path}[{index}]"] = f"{item!r} is listed twice"
            continue
        choices.append(parsed)
    return {"type": "categorical", "choices": choices}


def _range(name: str, value: dict, parser: Callable[[Any], Any], path: str, errors: dict[str, str]) -> dict | None:
    unknown = sorted(set(value) - {"low", "high", "log", "step"})
    if unknown:
        errors[f"{path}.{unknown[0]}"] = "is not a range field (low, high, log, step; or give choices)"
        return None
    bounds: dict[str, int | float] = {}
    for key in ("low", "high"):
        if key not in value:
            errors[f"{path}.{key}"] = "is required for a range"
            continue
        try:
            bounds[key] = _number(parser, value[key])
        except ValueError as exc:
            errors[f"{path}.{key}"] = str(exc)
        except TypeError:
            errors[path] = f"{name} takes choices, not a range: give a list like [a, b]"
            return None
    if len(bounds) < 2:
        return None
    low, high = bounds["low"], bounds["high"]
    kind = "int" if isinstance(low, int) and isinstance(high, int) else "float"
    low, high = (int(low), int(high)) if kind == "int" else (float(low), float(high))
    if not high > low:
        errors[f"{path}.high"] = f"must be greater than low ({low:g}), got {high:g}"
        return None
    log = False
    if "log" in value:
        try:
            log = bool_parse(value["log"])
        except ValueError as exc:
            errors[f"{path}.log"] = str(exc)
            return None
        if log and low <= 0:
            errors[f"{path}.low"] = f"must be above 0 on a log scale, got {low:g}"
            return None
    step: int | float | None = None
    if "step" in value:
        if log:
            errors[f"{path}.step"] = "give step or log: true, not both"
            return None
        try:
            raw = value["step"]
            # An int is finite however long; float() of one past a float's range (a JSON integer of
            # 309+ digits) raised OverflowError, a 500 (review27): it is larger than any range.
            if (isinstance(raw, bool) or not isinstance(raw, (int, float))
                    or isinstance(raw, float) and not math.isfinite(raw) or raw <= 0):
                raise ValueError(f"must be a number above 0, got {raw!r}")
            if kind == "int" and isinstance(raw, float) and not raw.is_integer():
                raise ValueError(f"must be a whole number: {name} is an integer, got {raw!r}")
            step = int(raw) if kind == "int" else float(raw) if raw < 2**1023 else math.inf
            if step < SMALLEST:
                raise ValueError(f"must be at least {SMALLEST:g} (a grid keeps {DECIMALS} decimals), got {raw!r}")
        except ValueError as exc:
            errors[f"{path}.step"] = str(exc)
            return None
        if step > high - low:
            errors[f"{path}.step"] = f"is larger than the range ({high - low:g})"
            return None
    return {"type": kind, "low": low, "high": high, "log": log, "step": step}


def _parameters(value: Any, args: dict[str, Callable[[Any], Any]], reserved: dict[str, str],
                errors: dict[str, str]) -> dict[str, dict]:
    path = "sweep.parameters"
    if not isinstance(value, dict) or not value:
        errors[path] = "is required: a mapping of training arguments to ranges or choices, e.g. {lr0: {low: 1.0e-4, high: 0.1, log: true}}"
        return {}
    if len(value) > MAX_PARAMETERS:
        errors[path] = f"has {len(value)} parameters; at most {MAX_PARAMETERS}"
        return {}
    parameters: dict[str, dict] = {}
    for name, spec in value.items():
        where = f"{path}.{name}"
        if name in reserved:
            errors[where] = f"cannot be set: {reserved[name]}"
            continue
        if name in NOT_SWEPT:
            errors[where] = f"cannot be swept: {NOT_SWEPT[name]}"
            continue
        parser = args.get(name)
        if parser is None:
            errors[where] = "is not an allowed training argument"
            continue
        if isinstance(spec, dict) and "choices" in spec:
            if len(spec) > 1:
                errors[where] = "give choices or a range (low, high), not both"
                continue
            parsed = _choices(name, spec["choices"], parser, f"{where}.choices", errors)
        elif isinstance(spec, list):
            parsed = _choices(name, spec, parser, where, errors)
        elif isinstance(spec, dict):
            parsed = _range(name, spec, parser, where, errors)
        else:
            errors[where] = "must be a list of choices or a range like {low: 1.0e-4, high: 0.1, log: true}"
            continue
        if name == "model" and parsed is not None and parsed["type"] != "categorical":
            errors[where] = "takes choices, not a range"
            continue
        if parsed is not None:
            parameters[name] = parsed
    return parameters


def grid_values(parameter: dict) -> list[Any]:
    """The values a grid tries for one parameter: its choices, or its stepped range from low to high."""
    if parameter["type"] == "categorical":
        return list(parameter["choices"])
    low, high, step = parameter["low"], parameter["high"], parameter["step"]
    count = int(math.floor((high - low) / step + 1e-9)) + 1
    if parameter["type"] == "int":
        return [low + i * step for i in range(count)]
    return [round(low + i * step, DECIMALS) for i in range(count)]


def grid_expand(parameters: dict[str, dict]) -> list[dict[str, Any]]:
    """Every combination, in a fixed order: the first parameter varies slowest (trial n gets row n)."""
    names = list(parameters)
    return [dict(zip(names, row, strict=True))
            for row in itertools.product(*(grid_values(parameters[name]) for name in names))]


def grid_size(parameters: dict[str, dict]) -> int:
    return math.prod(len(grid_values(p)) for p in parameters.values())


def _prune(value: Any, errors: dict[str, str]) -> dict | None:
    path = "sweep.prune"
    if value in (None, False, "none"):
        return None
    if isinstance(value, str):
        value = {"method": value}
    if not isinstance(value, dict):
        errors[path] = f"must be one of {', '.join(PRUNERS)}, or a mapping like {{method: median, startup_trials: 2}}"
        return None
    method = value.get("method")
    if method not in PRUNERS:
        errors[f"{path}.method" if isinstance(value, dict) and len(value) > 1 else path] = (
            f"must be one of {', '.join(PRUNERS)}; got {method!r}")
        return None
    options = {"median": {"startup_trials": (2, 0, 1000), "warmup_epochs": (1, 0, 10000)},
               "asha": {"min_epochs": (1, 1, 10000), "reduction_factor": (3, 2, 100)}}[method]
    pruner: dict[str, Any] = {"method": method}
    for key in value:
        if key != "method" and key not in options:
            errors[f"{path}.{key}"] = f"is not an option of {method} ({', '.join(options)})"
    for key, (default, lo, hi) in options.items():
        try:
            pruner[key] = _int_in(value.get(key, default), lo, hi)
        except ValueError as exc:
            errors[f"{path}.{key}"] = str(exc)
    return pruner


# Ultralytics' optimizer=auto (its default) picks the optimizer, lr0 and momentum itself and
# ignores the given ones (ultralytics/engine/trainer.py, build_optimizer): sweeping them would
# train every trial alike.
IGNORED_WITH_AUTO_OPTIMIZER = ("lr0", "momentum")


def sweep_parse(value: Any, *, args: dict[str, Callable[[Any], Any]], reserved: dict[str, str],
                errors: dict[str, str], base: dict[str, Any] | None = None) -> dict[str, Any]:
    """Validate a ``sweep:`` mapping into its normalised form; problems go into ``errors``.

    ``base`` is the training arguments every trial starts from (the spec's ``command``)."""
    if not isinstance(value, dict):
        errors["sweep"] = "must be a mapping: {method, parameters, trials, parallel, metric, prune}"
        return {}
    for key in value:
        if key not in SWEEP_KEYS:
            errors[f"sweep.{key}"] = f"is not a sweep field (known: {', '.join(SWEEP_KEYS)})"
    method = value.get("method", "tpe")
    if method not in METHODS:
        errors["sweep.method"] = f"must be one of {', '.join(METHODS)}; got {method!r}"
    parameters = _parameters(value.get("parameters"), args, reserved, errors)
    if str((base or {}).get("optimizer", "auto")).lower() == "auto" and "optimizer" not in parameters:
        for name in IGNORED_WITH_AUTO_OPTIMIZER:
            if name in parameters:
                errors[f"sweep.parameters.{name}"] = (
                    f"Ultralytics ignores {name} with optimizer=auto (its default) and picks its own: give an "
                    f"optimizer in the command (optimizer=SGD, AdamW, …) or sweep optimizer too")

    trials = None
    if method == "grid" and parameters and not any(k.startswith("sweep.parameters") for k in errors):
        for name, parameter in parameters.items():
            if parameter["type"] != "categorical" and parameter["step"] is None:
                errors[f"sweep.parameters.{name}"] = ("a grid needs choices or a range with a step "
                                                      "(e.g. {low: 0.001, high: 0.01, step: 0.003})")
        if not any(k.startswith("sweep.parameters") for k in errors):
            size = grid_size(parameters)
            if size > MAX_TRIALS:
                errors["sweep.parameters"] = f"make a grid of {size} combinations; at most {MAX_TRIALS}"
            elif "trials" in value and value["trials"] != size:
                errors["sweep.trials"] = (f"the grid has {size} combinations, so a grid sweep runs {size} trials: "
                                          f"leave trials out or give {size}")
            trials = size
    if trials is None:
        if "trials" not in value:
            if method != "grid":
                errors["sweep.trials"] = f"is required for a {method} sweep: how many trials to run (1-{MAX_TRIALS})"
        else:
            try:
                trials = _int_in(value["trials"], 1, MAX_TRIALS)
            except ValueError as exc:
                errors["sweep.trials"] = str(exc)
    # Not when an entry was refused: ``parameters`` then holds what was left, not the space as given.
    if (trials and trials > 1 and method != "grid" and parameters
            and not any(k.startswith("sweep.parameters") for k in errors)
            and all(p["type"] == "categorical" and len(p["choices"]) == 1 for p in parameters.values())):
        # Ultralytics trains deterministically: every trial would train the same configuration (trial26).
        point = ", ".join(f"{name}={p['choices'][0]}" for name, p in parameters.items())
        errors["sweep.trials"] = (f"is {trials}, but the search space has one point ({point}): every trial would "
                                  f"train alike; give more choices or a range, or 1 trial")
    parallel = DEFAULT_PARALLEL
    if "parallel" in value:
        try:
            parallel = _int_in(value["parallel"], 1, MAX_TRIALS)
        except ValueError as exc:
            errors["sweep.parallel"] = str(exc)
    if trials:
        parallel = min(parallel, trials)

    metric = value.get("metric", DEFAULT_METRIC)
    if not isinstance(metric, str) or not METRIC_PATTERN.fullmatch(metric):
        errors["sweep.metric"] = (f"must be a metric the training reports and that grows with quality: "
                                  f"metrics/… (e.g. {DEFAULT_METRIC}, metrics/mAP50(B)) or fitness; got {metric!r}")
    prune = _prune(value.get("prune"), errors)
    seed = None
    if value.get("seed") is not None:
        try:
            seed = _int_in(value["seed"], 0, 2**31 - 1)
        except ValueError as exc:
            errors["sweep.seed"] = str(exc)
    return {"method": method, "parameters": parameters, "trials": trials, "parallel": parallel, "metric": metric,
            "prune": prune, "seed": seed}
