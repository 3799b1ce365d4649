"""Reads that only the pages need, scoped to the caller like every selector."""

from __future__ import annotations

from datetime import date, timedelta

from django.db.models import Sum
from django.db.models.functions import TruncDate
from django.urls import reverse
from django.utils import timezone

from apps.accounts.selectors import team_list
from apps.core.storage import StorageUnavailable
from apps.jobs.models import HOLDING_STATES, Job
from apps.quotas.models import UsageRecord
from apps.quotas.selectors import running_gpu_seconds
from apps.registry.api import prediction_results
from apps.registry.selectors import evaluation_list, export_list, prediction_list

# A segment model reports its boxes (B) and its masks (M), a pose model its boxes and keypoints (P):
# its headline is its own task's figure, the mask or keypoint one, named by HEADLINE_OF. Box first
# showed a segment model's box mAP as its "mAP50-95" (trial21).
METRIC_COLUMNS = [
    ("mAP50-95", ("metrics/mAP50-95(M)", "metrics/mAP50-95(P)", "metrics/mAP50-95(B)")),
    ("mAP50", ("metrics/mAP50(M)", "metrics/mAP50(P)", "metrics/mAP50(B)")),
    ("precision", ("metrics/precision(M)", "metrics/precision(P)", "metrics/precision(B)")),
    ("recall", ("metrics/recall(M)", "metrics/recall(P)", "metrics/recall(B)")),
    ("top1", ("metrics/accuracy_top1",)),
]
HEADLINE_OF = {"(M)": "mask", "(P)": "keypoints", "(B)": "box"}


# Annotated images a predict job's page shows (the gallery has them all).
PREDICTION_PREVIEWS = 8


def job_outcome(*, user, job) -> dict:
    """What a val, predict or export job stored, for its page (a training's page has its curves).

    val: its ``evaluation`` and the ``headline`` numbers; predict: its ``prediction_run`` and the
    first few annotated images (``previews``; ``storage_down`` while the artifact store cannot be
    reached); export: its ``exports``. Nothing until the job succeeded: the rows are written then.
    """
    mode = (job.spec or {}).get("mode") or "train"
    outcome: dict = {"mode": mode}
    if mode == "val":
        evaluation = evaluation_list(user=user).filter(job=job).select_related("version").first()
        outcome["evaluation"] = evaluation
        outcome["headline"] = headline_metrics(evaluation.metrics or {}) if evaluation else {}
        outcome["headline_of"] = headline_of(evaluation.metrics or {}) if evaluation else ""
    elif mode == "predict":
        run = prediction_list(user=user).filter(job=job).first()
        outcome["prediction_run"] = run
        outcome["previews"], outcome["storage_down"] = [], False
        if run is not None:
            try:
                results = prediction_results(run)[:PREDICTION_PREVIEWS]
            except StorageUnavailable:
                results, outcome["storage_down"] = [], True
            outcome["previews"] = [{**item, "index": index, "url": reverse("api-job-prediction-image",
                                                                           args=[job.pk, index])}
                                   for index, item in enumerate(results)]
    elif mode == "export":
        outcome["exports"] = [{"export": export, "filename": export.key.rsplit("/", 1)[-1]}
                              for export in export_list(user=user).filter(job=job).order_by("created_at")]
    return outcome


def usage_by_day(*, user, days: int = 14) -> dict:
    """GPU-hours per day over the last ``days`` days: the caller's and each of their teams'.

    Finished attempts count on the day they ended; what runs now counts today.
    """
    now = timezone.now()
    today = timezone.localdate(now)
    labels = [today - timedelta(days=n) for n in range(days - 1, -1, -1)]
    since = now - timedelta(days=days + 1)

    def series(records, running) -> list[float]:
        per_day: dict[date, float] = {
            row["day"]: row["seconds"] or 0.0
            for row in records.filter(ended_at__gte=since).annotate(day=TruncDate("ended_at"))
            .values("day").annotate(seconds=Sum("gpu_seconds"))
        }
        per_day[today] = per_day.get(today, 0.0) + running_gpu_seconds(running, now)
        return [round(per_day.get(day, 0.0) / 3600, 3) for day in labels]

    mine = series(UsageRecord.objects.filter(user=user), Job.objects.filter(user=user, state__in=HOLDING_STATES))
    teams = {
        team.slug: series(UsageRecord.objects.filter(team=team), Job.objects.filter(team=team, state__in=HOLDING_STATES))
        for team in team_list(user=user)
    }
    return {"labels": [day.isoformat() for day in labels], "me": mine, "teams": teams}


def headline_metrics(values: dict) -> dict[str, float | None]:
    """The few numbers people compare models by: the task's own (mask, keypoints, else box)."""
    found: dict[str, float | None] = {}
    for label, keys in METRIC_COLUMNS:
        found[label] = next((values[k] for k in keys if values.get(k) is not None), None)
    return found


def headline_of(values: dict) -> str:
    """What :func:`headline_metrics` measured: ``mask``, ``keypoints``, ``box``, ``top-1`` (a classifier:
    no mAP, its accuracy instead), or ``""``."""
    key = next((k for k in METRIC_COLUMNS[0][1] if values.get(k) is not None), "")
    if not key and values.get("metrics/accuracy_top1") is not None:
        return "top-1"
    return HEADLINE_OF.get(key[-3:], "")
