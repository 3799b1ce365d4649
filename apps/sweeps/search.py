"""The search itself: which parameters the next trial gets, and whether a running trial is pruned.

Plain Python over Optuna, no Django: the sweep step (:mod:`apps.sweeps.services`) hands in
what the database holds about a sweep's trials (:class:`TrialRecord`) and gets back
proposals and pruning decisions. Optuna keeps no state of its own here: each call builds an
in-memory study from the records (ask-and-tell), so the database stays the one source of
truth and a restarted scheduler carries on where the last one stopped. What a pruner keeps
per trial (ASHA's rung values) comes back as ``system_attrs`` for the caller to store.

Proposals are reproducible: trial ``n`` of a sweep with seed ``s`` is sampled with a seed
derived from ``(s, n)``, so asking again with the same history gives the same parameters.
"""

from __future__ import annotations

import hashlib
import math
import warnings
from dataclasses import dataclass, field
from typing import Any

from apps.jobs.spec_sweep import SMALLEST, grid_expand

RUNNING, COMPLETE, PRUNED, FAILED = "running", "complete", "pruned", "failed"


@dataclass
class TrialRecord:
    """One trial as the search sees it."""

    number: int
    params: dict[str, Any]
    state: str  # running | complete | pruned | failed
    value: float | None = None  # the metric of a complete trial
    intermediate: dict[int, float] = field(default_factory=dict)  # epoch (1-based) → metric
    system_attrs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PruneDecision:
    prune: bool
    message: str
    system_attrs: dict[str, Any]


def trials_to_create(*, created: int, active: int, trials: int, parallel: int) -> int:
    """How many new trials to submit now: keep at most ``parallel`` queued or running, ``trials`` in all."""
    return max(0, min(parallel - active, trials - created))


def trial_seed(seed: int, number: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{number}".encode()).digest()[:4], "big")


def tpe_startup_trials(trials: int) -> int:
    """Random trials before TPE models the history. Optuna's default of 10 would leave a sweep of
    10 trials or fewer purely random; a third of the trials, between 2 and 10, keeps both halves."""
    return min(10, max(2, trials // 3))


def _optuna():
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna


def distributions(parameters: dict[str, dict]) -> dict[str, Any]:
    optuna = _optuna()
    found = {}
    for name, p in parameters.items():
        if p["type"] == "categorical":
            found[name] = optuna.distributions.CategoricalDistribution(p["choices"])
        elif p["type"] == "int":
            found[name] = optuna.distributions.IntDistribution(p["low"], p["high"], log=p["log"], step=p["step"] or 1)
        else:
            found[name] = optuna.distributions.FloatDistribution(p["low"], p["high"], log=p["log"], step=p["step"])
    return found


def _study(config: dict, records: list[TrialRecord], *, sampler=None, pruner=None, skip: int | None = None):
    optuna = _optuna()
    study = optuna.create_study(direction="maximize", sampler=sampler or optuna.samplers.RandomSampler(seed=0),
                                pruner=pruner or optuna.pruners.NopPruner())
    dists = distributions(config["parameters"])
    states = {RUNNING: optuna.trial.TrialState.RUNNING, COMPLETE: optuna.trial.TrialState.COMPLETE,
              PRUNED: optuna.trial.TrialState.PRUNED, FAILED: optuna.trial.TrialState.FAIL}
    for record in sorted(records, key=lambda r: r.number):
        if record.number == skip:
            continue
        complete = record.state == COMPLETE and record.value is not None and math.isfinite(record.value)
        state = states[record.state] if record.state != COMPLETE or complete else states[FAILED]
        params = {k: v for k, v in record.params.items() if k in dists}
        study.add_trial(optuna.trial.create_trial(
            params=params, distributions={k: dists[k] for k in params}, state=state,
            value=record.value if complete else None,
            intermediate_values={int(k): v for k, v in record.intermediate.items()},
            system_attrs=dict(record.system_attrs)))
    return study


def propose(config: dict, records: list[TrialRecord], number: int) -> dict[str, Any]:
    """The parameters of trial ``number`` (0-based), given the trials before it.

    grid: row ``number`` of the expansion (:func:`apps.jobs.spec_sweep.grid_expand`).
    random: Optuna's RandomSampler; tpe: its TPESampler with a constant liar, so trials
    still running count as "about as good as the worst so far" and parallel trials spread out.
    """
    if config["method"] == "grid":
        return grid_expand(config["parameters"])[number]
    optuna = _optuna()
    seed = trial_seed(config["seed"] or 0, number)
    if config["method"] == "tpe":
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=tpe_startup_trials(config["trials"]),
                                             constant_liar=True)
    else:
        sampler = optuna.samplers.RandomSampler(seed=seed)
    study = _study(config, [r for r in records if r.number < number], sampler=sampler)
    trial = study.ask(distributions(config["parameters"]))
    return {name: nearer_zero_is_zero(value) for name, value in trial.params.items()}


def nearer_zero_is_zero(value: Any) -> Any:
    """A sampled float nearer 0 than SMALLEST as 0.0, the value the submit takes (spec._float refuses
    0 < |x| < 1e-12: the trial was submitted, refused and counted failed). Two ways to get one: a range
    from 0 to a tiny high (``{low: 0, high: 2.0e-12}``: every other sample), and a stepped range
    through 0 (``{low: -0.3, high: 0.3, step: 0.1}``: -0.3 + 3 × 0.1 is 5.6e-17). Snapped, not refused
    at submission: [-0.3, 0.3] by 0.1 is a sensible range, and 0 lies in any range that sampled such
    a value (each bound is 0 or at least SMALLEST in size), so the snapped value is one the sampler
    could have drawn and Optuna takes it back as history. A grid already rounds (grid_values)."""
    if isinstance(value, float) and 0 < abs(value) < SMALLEST:
        return 0.0
    return value


def pruner_for(config: dict):
    """Optuna's pruner for the sweep's ``prune`` block (None when it prunes nothing).

    median: MedianPruner. ``startup_trials``: none is pruned before that many trials
    completed; ``warmup_epochs``: none is pruned at its first that-many epochs (Optuna
    counts steps from ``n_warmup_steps``; our epochs start at 1). asha: SuccessiveHalving
    with rungs at ``min_epochs`` × ``reduction_factor``^k epochs.
    """
    prune = config.get("prune")
    if not prune:
        return None
    optuna = _optuna()
    if prune["method"] == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=prune["startup_trials"],
                                           n_warmup_steps=prune["warmup_epochs"] + 1)
    return optuna.pruners.SuccessiveHalvingPruner(min_resource=prune["min_epochs"],
                                                  reduction_factor=prune["reduction_factor"])


def prune_decide(config: dict, records: list[TrialRecord], trial: TrialRecord, epoch: int) -> PruneDecision:
    """Whether the pruner stops ``trial`` after it reported ``epoch``, as Optuna's
    ``trial.report(value, epoch)`` + ``trial.should_prune()`` would answer, given the other
    trials as they are now. The message says why, with the figures compared."""
    pruner = pruner_for(config)
    seen = {e: v for e, v in trial.intermediate.items() if int(e) <= epoch}
    if pruner is None or epoch not in seen:
        return PruneDecision(False, "", trial.system_attrs)
    study = _study(config, records, pruner=pruner, skip=trial.number)
    optuna = _optuna()
    dists = distributions(config["parameters"])
    params = {k: v for k, v in trial.params.items() if k in dists}
    study.add_trial(optuna.trial.create_trial(
        params=params, distributions={k: dists[k] for k in params}, state=optuna.trial.TrialState.RUNNING,
        intermediate_values=seen, system_attrs=dict(trial.system_attrs)))
    frozen = study.get_trials(deepcopy=False)[-1]
    prune = pruner.prune(study, frozen)
    attrs = dict(study._storage.get_trial(frozen._trial_id).system_attrs)
    return PruneDecision(prune, _why(config, records, trial, seen, epoch, attrs) if prune else "", attrs)


def _why(config: dict, records: list[TrialRecord], trial: TrialRecord, seen: dict[int, float], epoch: int,
         attrs: dict[str, Any]) -> str:
    metric = config["metric"]
    values = [v for v in seen.values() if v is not None and math.isfinite(v)]
    if not values:
        return f"pruned at epoch {epoch} ({metric} was not reported as a number)"
    if config["prune"]["method"] == "median":
        best = max(values)
        others = [r.intermediate[epoch] for r in records
                  if r.state == COMPLETE and r.number != trial.number and epoch in r.intermediate]
        median = _median(others)
        return (f"pruned at epoch {epoch} ({metric} {best:.4g} below the median of trials at that epoch, "
                f"{median:.4g} over {len(others)} completed trial(s))")
    # ASHA (Optuna's SuccessiveHalvingPruner) records the value each trial had at each rung it
    # reached; the trial is stopped at the rung where it is not in the top 1/reduction_factor.
    factor = config["prune"]["reduction_factor"]
    rung = sum(1 for key in attrs if key.startswith("completed_rung_")) - 1
    key = f"completed_rung_{rung}"
    rivals = sum(1 for r in records if r.number != trial.number and key in r.system_attrs)
    return (f"pruned at epoch {epoch} ({metric} {seen[epoch]:.4g} not in the top 1/{factor} of the "
            f"{rivals + 1} trials that reached rung {rung})")


def _median(values: list[float]) -> float:
    import numpy as np

    return float(np.nanpercentile(np.array(values, dtype=float), 50)) if values else math.nan
