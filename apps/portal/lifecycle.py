"""Pages of the model lifecycle: datasets (upload, statistics, samples), weights, a model
version with its lineage, the comparison of 2–4 versions, a predict job's gallery.

Uploads go from the browser straight to the REST API (``/api/v1/datasets/``,
``/api/v1/weights/``) with the session and CSRF token, so a page can do nothing the API
would refuse; reads go through the same selectors, writes (stages) through the same services.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse

from apps.accounts.selectors import is_manager_of, team_list
from apps.accounts.services import storage_limit_bytes, storage_used_bytes
from apps.core.buttons import button_only
from apps.core.guards import InUse
from apps.core.selectors import get_or_404
from apps.core.storage import StorageUnavailable
from apps.datasets.selectors import dataset_list
from apps.datasets.services import dataset_delete
from apps.jobs.models import MetricPoint
from apps.jobs.selectors import JOB_NOT_VISIBLE, job_list
from apps.registry.api import prediction_results
from apps.registry.models import ModelVersion, PredictionRun, SharedWeights, Stage
from apps.registry.selectors import model_list
from apps.registry.services import STAGE_MOVES, StageRefused, model_stage_set

from .selectors import headline_metrics, headline_of

DATASET_NOT_VISIBLE = "No dataset with that id in your teams."
MODEL_NOT_VISIBLE = "No model with that id in your teams."
GALLERY_PAGE = 48
LARGEST_ID = 2**63 - 1  # a database id (BigAutoField) is never larger
# Curves the compare page overlays (first key present wins, per task suffix).
CURVES = [
    ("mAP50-95", ("metrics/mAP50-95(M)", "metrics/mAP50-95(P)", "metrics/mAP50-95(B)", "metrics/accuracy_top1")),
    ("val box loss", ("val/box_loss", "val/loss")),
    ("train box loss", ("train/box_loss", "train/loss")),
]


def storage_of(user) -> list[dict]:
    return [{"team": t.slug, "used": storage_used_bytes(t), "limit": storage_limit_bytes(t)}
            for t in team_list(user=user)]


# --- datasets ---------------------------------------------------------------------------------


@login_required
def datasets(request):
    return render(request, "portal/datasets.html", {
        "datasets": dataset_list(user=request.user).select_related("uploaded_by"),
        "teams": [t.slug for t in team_list(user=request.user)],
        "storage": storage_of(request.user),
        "limit": settings.DATASET_UPLOAD_MAX_BYTES,
    })


@login_required
def dataset_detail(request, pk: int):
    dataset = get_or_404(dataset_list(user=request.user), pk, DATASET_NOT_VISIBLE)
    stats = dataset.stats or {}
    samples = [{"url": reverse("api-dataset-sample", args=[dataset.pk, i]), "split": s.get("split"),
                "image": s.get("image"), "boxes": [{"cls": b[0], "name": name_of(dataset.names, b[0]),
                                                   "x": b[1] - b[3] / 2, "y": b[2] - b[4] / 2, "w": b[3], "h": b[4]}
                                                  for b in s.get("boxes") or []],
                # A classification sample has no boxes: its class is its folder's.
                "class_name": name_of(dataset.names, s["class"]) if s.get("class") is not None else ""}
               for i, s in enumerate(stats.get("samples") or [])]
    return render(request, "portal/dataset.html", {
        "dataset": dataset,
        "splits": stats.get("splits") or {},
        "samples": samples,
        "skipped": stats.get("skipped") or [],
        "label_warnings": dataset.label_warnings(),
        "versions": dataset_list(user=request.user).filter(team=dataset.team, name=dataset.name),
        "chart": {"names": dataset.names, "histogram": stats.get("histogram") or {}},
        "can_delete": is_manager_of(user=request.user, team=dataset.team),
    })


@login_required
@button_only("dataset", kwarg="pk")
def dataset_delete_view(request, pk: int):
    """The dataset page's Delete (managers), as the API's DELETE datasets/{id}/: refused while an
    active job reads the version."""
    dataset = get_or_404(dataset_list(user=request.user), pk, DATASET_NOT_VISIBLE)
    if not is_manager_of(user=request.user, team=dataset.team):
        messages.error(request, "Only a manager of the team may delete a dataset version.")
        return redirect("dataset", pk=dataset.pk)
    reference = dataset.reference
    try:
        dataset_delete(dataset=dataset, by=request.user)
    except InUse as exc:
        messages.error(request, f"{reference} was not deleted: {exc}")
        return redirect("dataset", pk=pk)
    messages.success(request, f"Deleted {reference}; its version number is not issued again.")
    return redirect("datasets")


def name_of(names: list, cls: int) -> str:
    return names[cls] if 0 <= cls < len(names) else str(cls)


# --- weights ----------------------------------------------------------------------------------


@login_required
def weights(request):
    return render(request, "portal/weights.html", {
        "uploads": model_list(user=request.user).filter(source=ModelVersion.Source.UPLOAD),
        "shared": SharedWeights.objects.all(),
        "teams": [t.slug for t in team_list(user=request.user)],
        "storage": storage_of(request.user),
        "limit": settings.WEIGHTS_UPLOAD_MAX_BYTES,
    })


# --- a model version, stages, compare -----------------------------------------------------------


@login_required
def model_detail(request, pk: int):
    version = get_or_404(model_list(user=request.user).prefetch_related("exports", "evaluations", "children"),
                         pk, MODEL_NOT_VISIBLE)
    manager = is_manager_of(user=request.user, team=version.team)
    return render(request, "portal/model.html", {
        "version": version,
        "headline": headline_metrics(version.metrics or {}),
        "lineage": (lineage := version.lineage or {}),
        "lineage_dataset_gone": bool((lineage.get("dataset") or {}).get("id")) and not dataset_list(
            user=request.user).filter(pk=lineage["dataset"]["id"]).exists(),  # deleted since: named, not linked
        "moves": sorted(STAGE_MOVES[Stage(version.stage)]) if manager else [],
        "manager": manager,
        "evaluations": version.evaluations.select_related("job"),
        "exports": version.exports.all(),
        "predictions": PredictionRun.objects.filter(version=version).select_related("job")[:20],
        "children": model_list(user=request.user).filter(parent=version),
    })


@login_required
@button_only("model", kwarg="pk")
def model_stage(request, pk: int):
    version = get_or_404(model_list(user=request.user), pk, MODEL_NOT_VISIBLE)
    if not is_manager_of(user=request.user, team=version.team):
        messages.error(request, "Only a manager of the team may change a model's stage.")
        return redirect("model", pk=version.pk)
    try:
        changed = model_stage_set(version=version, stage=request.POST.get("stage", ""), by=request.user)
    except StageRefused as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, "; ".join(f"{v.reference} is now {v.stage}" for v in changed) or "No change.")
    return redirect("model", pk=version.pk)


MISSING_IDS_SHOWN = 5


@login_required
def models_compare(request):
    raw = [part for value in request.GET.getlist("ids") for part in value.split(",") if part.strip()]
    ids = []
    for part in raw:
        # ASCII digits only ('²'.isdigit() is True, int('²') raises), and no id past the database's
        # integers (an OverflowError in the query): both were 500s (sec19, F5).
        if not (part.strip().isascii() and part.strip().isdigit()):
            raise Http404("Compare takes model ids (numbers).")
        # int() of over 4300 digits raises (a 500, review32): one past 19 is no id, kept as its text.
        digits = part.strip().lstrip("0") or "0"
        ids.append(int(digits) if len(digits) <= 19 else digits)
    versions = list(model_list(user=request.user).filter(
        pk__in=[pk for pk in ids if isinstance(pk, int) and pk <= LARGEST_ID]))
    versions.sort(key=lambda v: ids.index(v.pk))
    problem = ""
    if missing := list(dict.fromkeys(pk for pk in ids if pk not in {v.pk for v in versions})):
        # Named (trial31: "?ids=1,99999" said "No model with that id" without saying which). Another
        # team's id is named the same as one that does not exist: the answer tells nothing more.
        # The first few, then how many: a URL of hundreds of ids was a 404 naming every one (review32).
        shown = [str(pk) if len(str(pk)) <= 20 else f"{str(pk)[:20]}…" for pk in missing[:MISSING_IDS_SHOWN]]
        more = f" … ({len(missing)} in all)" if len(missing) > MISSING_IDS_SHOWN else ""
        raise Http404(f"No model with id {shown[0]} in your teams." if len(missing) == 1 else
                      f"No models with ids {', '.join(shown)}{more} in your teams.")
    if not 2 <= len(versions) <= 4:
        problem = "Pick 2 to 4 versions to compare (tick them on the Models page)."
    keys = sorted({k for v in versions for k in (v.metrics or {}) if k.startswith("metrics/") or k == "fitness"})
    rows = [{"metric": key, "values": [(v.metrics or {}).get(key) for v in versions]} for key in keys]
    for row in rows:
        numbers = [x for x in row["values"] if isinstance(x, (int, float))]
        row["best"] = max(numbers) if numbers and "loss" not in row["metric"] else None
    curves = {"versions": [v.reference for v in versions], "series": {}}
    for label, candidates in CURVES:
        per_version = []
        for v in versions:
            points = MetricPoint.objects.filter(job_id=v.job_id).order_by("epoch") if v.job_id else []
            series = []
            for point in points:
                value = next((point.values.get(k) for k in candidates if point.values.get(k) is not None), None)
                if value is not None:
                    series.append({"x": point.epoch, "y": value})
            per_version.append(series)
        curves["series"][label] = per_version
    return render(request, "portal/compare.html", {
        "versions": versions, "rows": rows, "curves": curves, "problem": problem,
        "evaluations": {v.pk: evaluation_summary(v.evaluations.first()) for v in versions},
    }, status=400 if problem else 200)


def evaluation_summary(evaluation) -> dict | None:
    """A version's newest evaluation in one cell: its split and headline mAP50-95 (a segment model's
    mask figure, named). Every ``mAP50-95`` key was printed before, box and mask run together."""
    if evaluation is None:
        return None
    values = evaluation.metrics or {}
    of = headline_of(values)
    figure = headline_metrics(values)["top1" if of == "top-1" else "mAP50-95"]  # a classifier's: its accuracy
    return {"split": evaluation.split, "map": figure, "of": of}


# --- predictions ----------------------------------------------------------------------------------


def _predicted_names(item: dict) -> set[str]:
    """The classes an image's prediction found: its boxes', or a classifier's top-1."""
    names = {b["name"] for b in item.get("boxes") or []}
    if item.get("top5"):
        names.add(item["top5"][0]["name"])
    return names


@login_required
def predictions(request, job_id):
    job = get_or_404(job_list(user=request.user), job_id, JOB_NOT_VISIBLE)
    run = PredictionRun.objects.filter(job=job).select_related("version").first()
    if run is None:
        raise Http404("This job has no predictions (yet).")
    try:
        results = prediction_results(run)
    except StorageUnavailable:
        return HttpResponse("The artifact storage cannot be reached right now; try again in a minute.",
                            status=503, content_type="text/plain")
    for index, item in enumerate(results):
        item["index"] = index
        item["url"] = reverse("api-job-prediction-image", args=[job.pk, index])
    classes = sorted({name for item in results for name in _predicted_names(item)})
    wanted = request.GET.get("class", "")
    shown = [r for r in results if not wanted or wanted in _predicted_names(r)]
    page = Paginator(shown, GALLERY_PAGE).get_page(request.GET.get("page"))
    return render(request, "portal/predictions.html", {
        "job": job, "run": run, "page": page, "classes": classes, "wanted": wanted, "total": len(results),
    })
