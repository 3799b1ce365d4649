"""Reads about sweeps, for the API, the portal page and ``yoloq`` (one shape for all three)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from apps.jobs.models import ACTIVE_STATES, Job, JobState

from .models import Trial

TOP_CURVES = 5


@dataclass(frozen=True)
class BestTrial:
    """The trial a sweep keeps: the highest metric, the first by trial number among equals."""

    number: int
    value: float
    tied: tuple[int, ...]  # every completed trial with that value, in trial order (the kept one first)
    completed: int

    @property
    def tie_note(self) -> str:
        """The tie in words ('' when there is none): a sweep whose trials all scored 0 said "best: trial 0"
        and no more, as if trial 0 had won (trial25 F12)."""
        if len(self.tied) < 2:
            return ""
        if len(self.tied) == self.completed:
            who = f"all {self.completed} completed trials"
        else:
            who = "trials " + ", ".join(map(str, self.tied[:-1])) + f" and {self.tied[-1]}"
        return f"{who} tied at {self.value:.4g}: kept trial {self.number}, the first by trial number"


def best_pick(scored: Iterable[tuple[int, float]]) -> BestTrial | None:
    """The best of (trial number, metric) pairs of completed trials, with any tie; None when there are none."""
    scored = sorted(scored)
    if not scored:
        return None
    value = max(v for _, v in scored)
    tied = tuple(n for n, v in scored if v == value)
    return BestTrial(number=tied[0], value=value, tied=tied, completed=len(scored))


def trial_state(trial: Trial) -> str:
    """What the table says: pruned, the job's state, or "not submitted"."""
    if trial.job is None:
        return "not submitted"
    if trial.pruned:
        return "pruned"
    return trial.job.state


def sweep_view(parent: Job) -> dict[str, Any]:
    """The sweep as the parent's page, the API (``GET jobs/<id>/sweep/``) and ``yoloq status`` show it:
    its search, counts, every trial (parameters, state, metric, epochs run, pruned or not), the best
    trial (with ``tied``, the trials that share its value, and ``tie_note``, that tie in words), best-so-far
    over trials, and the metric curves of the top trials."""
    config = parent.spec["sweep"]
    trials = list(Trial.objects.filter(sweep=parent).select_related("job", "job__model_version").order_by("number"))
    rows = []
    for trial in trials:
        job = trial.job
        curve = sorted((int(e), v) for e, v in trial.intermediate.items())
        rows.append({
            "number": trial.number,
            "job": str(job.pk) if job else None,
            "task_name": job.task_name if job else "",
            "state": trial_state(trial),
            "params": trial.params,
            "value": trial.value,
            "last": curve[-1][1] if curve else None,
            "epochs_done": job.epochs_done if job else 0,
            "epochs": (job.spec.get("train_args") or {}).get("epochs") if job else None,
            "pruned": trial.pruned,
            "pruned_epoch": trial.pruned_epoch,
            "note": trial.note,
            "curve": [{"epoch": e, "value": v} for e, v in curve],
        })
    picked = best_pick((r["number"], r["value"]) for r in rows if r["value"] is not None)
    best = None if picked is None else {**next(r for r in rows if r["number"] == picked.number),
                                        "tied": list(picked.tied), "tie_note": picked.tie_note}
    best_so_far, running_best = [], None
    for row in rows:
        if row["value"] is not None and (running_best is None or row["value"] > running_best):
            running_best = row["value"]
        if row["value"] is not None:
            best_so_far.append({"number": row["number"], "value": row["value"], "best": running_best})
    if best is not None:
        job = next(t.job for t in trials if t.number == best["number"])
        version = getattr(job, "model_version", None)
        best = {**best, "model_version": version.pk if version else None,
                "model_reference": f"{version.name}:v{version.version}" if version else ""}
    top = sorted(rows, key=lambda r: max((p["value"] for p in r["curve"]), default=float("-inf")), reverse=True)
    states = [r["state"] for r in rows]
    return {
        "id": str(parent.pk),
        "task_name": parent.task_name,
        "state": parent.state,
        "method": config["method"],
        "metric": config["metric"],
        "parameters": config["parameters"],
        "trials": config["trials"],
        "parallel": config["parallel"],
        "prune": config["prune"],
        "seed": config["seed"],
        "counts": {
            "submitted": sum(1 for t in trials if t.job is not None),
            "active": sum(1 for t in trials if t.job is not None and t.job.state in ACTIVE_STATES),
            "succeeded": states.count(JobState.SUCCEEDED),
            "pruned": states.count("pruned"),
            "failed": sum(states.count(s) for s in (JobState.FAILED, JobState.TIMED_OUT, "not submitted")),
            "cancelled": states.count(JobState.CANCELLED),
        },
        "best": best,
        "best_so_far": best_so_far,
        "top_curves": [r["number"] for r in top[:TOP_CURVES] if r["curve"]],
        "rows": rows,
    }
