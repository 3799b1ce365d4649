"""Reads about sweeps, for the API, the portal page and ``yoloq`` (one shape for all three)."""

from __future__ import annotations

from typing import Any

from apps.jobs.models import ACTIVE_STATES, Job, JobState

from .models import Trial

TOP_CURVES = 5


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
    trial, best-so-far over trials, and the metric curves of the top trials."""
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
    complete = [r for r in rows if r["value"] is not None]
    best = max(complete, key=lambda r: (r["value"], -r["number"])) if complete else None
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
