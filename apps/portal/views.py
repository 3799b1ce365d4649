"""Browser pages. Thin: reads go through selectors, writes through the same services the
REST API uses, so a page can do nothing the API would refuse."""

from __future__ import annotations

import json
import math
import re
import uuid
from urllib.parse import urlencode

import yaml
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import logout
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.cache import never_cache

from apps.accounts.selectors import managed_team_ids, team_list, token_list
from apps.accounts.services import TOKEN_MAX_DAYS, token_issue, token_revoke
from apps.accounts.throttles import AuthThrottle, SubmitThrottle, throttle_wait
from apps.cluster.selectors import cluster_overview, cluster_totals
from apps.core.buttons import button_only
from apps.core.errors import FieldErrors
from apps.core.selectors import get_or_404
from apps.core.storage import StorageUnavailable
from apps.core.strict_yaml import load_yaml
from apps.core.values import ascii_float, ascii_int
from apps.datasets.selectors import dataset_list
from apps.jobs.continuation import continue_available, continued_by, inputs_gone, job_continue, spec_memory, team_pinned
from apps.jobs.log_archive import logs_gone_note
from apps.jobs.models import ACTIVE_STATES, HOLDING_STATES, STATE_FILTERS, TERMINAL_STATES, JobState, PriorityClass
from apps.jobs.selectors import (
    JOB_NOT_VISIBLE,
    active_jobs_of,
    job_list,
    job_may_cancel,
    job_may_requeue,
    job_weights_find,
    queue_depth_by_class,
    team_active_jobs,
)
from apps.jobs.services import (
    DuplicateJob,
    JobClassRefused,
    TooManyActiveJobs,
    job_cancel,
    job_class_change,
    job_requeue,
    job_submit,
    spec_parse,
    spec_resolve,
    urgent_errors,
)
from apps.jobs.spec import SpecError, parse_gpus
from apps.monitoring.recorders import scheduler_status
from apps.monitoring.services import cluster_history
from apps.quotas.reports import GROUPS, report_for_page
from apps.quotas.selectors import usage_summary
from apps.registry.selectors import model_list
from apps.scheduling.standing import TEAM_NOT_VISIBLE, standing_teams, team_standings
from apps.sweeps.selectors import sweep_view

from .forms import SWEEP_METRICS, TRAIN_ARG_NAMES, JobForm, SweepForm, YamlSpecForm
from .selectors import headline_metrics, headline_of, job_outcome, usage_by_day

MODEL_SUGGESTIONS = ["yolov8n.yaml", "yolov8s.yaml", "yolov8m.yaml", "yolo11n.yaml", "yolo11s.yaml"]
EXAMPLE_SPEC = """\
task_name: yolo-v8n-demo
command: "yolo train data=demo model=yolov8n.yaml epochs=10 imgsz=640"
resources: {gpu: 1, memory: 8Gi, cpu: "4"}
priority: medium
timeout: 7200
"""


def example_spec(teams: list[str]) -> str:
    """The YAML box's example; for a member of several teams it names the first, as a submit from
    several teams must (apps.jobs.services.spec_team; review29: the example as shown was refused)."""
    return EXAMPLE_SPEC if len(teams) < 2 else f"team: {teams[0]}\n{EXAMPLE_SPEC}"
JOBS_PER_PAGE = 50


# --- dashboard ------------------------------------------------------------------------------


def dashboard_context(user) -> dict:
    nodes = cluster_overview(user=user)
    manages = bool(managed_team_ids(user=user))
    return {
        "nodes": nodes,
        "totals": cluster_totals(nodes),
        # Said above the queue when the scheduler is not planning (multi-node trial M9).
        "scheduler": scheduler_status(),
        "queue_depth": queue_depth_by_class(),
        "my_jobs": list(active_jobs_of(user=user).order_by("queue_position", "-created_at")[:50]),
        # A manager watches the team's work too, not only their own (trial 14, F14).
        "manages": manages,
        # A superuser sees every team's, whether they manage one or none (manager trial 15, F27).
        "every_team": user.is_superuser,
        "team_jobs": list(team_active_jobs(user=user).order_by("queue_position", "-created_at")[:50])
        if manages else [],
    }


@login_required
def dashboard(request):
    return render(request, "portal/dashboard.html", dashboard_context(request.user))


@login_required
@never_cache
def dashboard_live(request):
    """The part of the dashboard that htmx refreshes every few seconds."""
    return render(request, "portal/_dashboard_live.html", dashboard_context(request.user))


# --- jobs -----------------------------------------------------------------------------------


@login_required
def jobs(request):
    # A manager's list opens on the teams' jobs, a member's on their own (trial 14, F14).
    default_scope = "team" if managed_team_ids(user=request.user) else "mine"
    scope = request.GET.get("scope") or default_scope
    if scope not in ("mine", "team"):
        scope = default_scope
    state = request.GET.get("state", "")
    state = state if state in STATE_FILTERS else ""
    teams = [t.slug for t in team_list(user=request.user)]
    # A team that is none of the user's is no filter, as an unknown state is none: the page said
    # "Every job of <it> … 0 jobs" with "all" in the Team box (trial25 F6).
    team = request.GET.get("team", "")
    team = team if team in teams else ""
    queryset = job_list(user=request.user, mine=scope == "mine", team=team or None, state=state or None)
    page = Paginator(queryset.order_by("-created_at"), JOBS_PER_PAGE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    return render(request, "portal/jobs.html", {
        "page": page, "scope": scope, "default_scope": default_scope, "state": state, "team": team, "query": query.urlencode(),
        "teams": teams,
        "states": STATE_FILTERS,
    })


@login_required
def job_detail(request, job_id):
    job = get_or_404(job_list(user=request.user), job_id, JOB_NOT_VISIBLE)
    if job.is_sweep:
        return sweep_detail(request, job)
    model_version = getattr(job, "model_version", None) if job.state == JobState.SUCCEEDED else None
    outcome = job_outcome(user=request.user, job=job)
    return render(request, "portal/job.html", {
        **outcome,
        "job": job,
        "logs_gone": logs_gone_note(job),  # LOG_RETENTION_DAYS deleted them: say so under "Log" (optrial24)
        "inputs": (job.spec or {}).get("inputs") or {},
        # A version deleted since (its number is never reused): named, not linked to a 404.
        "input_dataset_gone": "data" in (gone := inputs_gone(job)),
        "input_model_gone": "model" in gone,
        "epochs": (job.spec.get("train_args") or {}).get("epochs"),
        "can_cancel": job.state in ACTIVE_STATES and job_may_cancel(user=request.user, job=job),
        **manager_actions(request.user, job),
        "model_version": model_version,
        "weights": job_weights_find(job),
        # A job continued already says by which job, and offers no second Continue (trial25 F3).
        "continued_by": (later := continued_by(job) if job.state in TERMINAL_STATES else None),
        "continue_point": (point := continue_available(job, gone) if job.state in TERMINAL_STATES and later is None
                           else None),
        # The submit form's unit (Timeout (hours)); after a refused Continue, what was typed.
        "continue_hours": request.GET.get("timeout_hours", f"{job.timeout_s / 3600:g}")[:32],
        "continue_memory": request.GET.get("memory", spec_memory(job) if point else "")[:32],
        "continue_gpu": request.GET.get("gpu", f"{job.gpus:g}")[:32],
        "continue_val": request.GET.get("val", "true" if _trains_with_val(job) else "") == "true",
        "continued_from": (job.spec or {}).get("continued_from"),
        # An ended job with no epoch said "curves appear after the first epoch" for ever (new-user trial 23).
        "curves_empty": ("no epoch finished, so there are no curves" if job.state in TERMINAL_STATES
                         and not job.metrics.exists() else "curves appear after the first epoch"),
        "scheduler": scheduler_status() if job.state == JobState.QUEUED else None,
        "trial": getattr(job, "trial", None) if job.parent_id else None,
        "page_config": {
            "job": str(job.pk),
            "state": job.state,
            "epochs": (job.spec.get("train_args") or {}).get("epochs"),
            "terminal": [s.value for s in TERMINAL_STATES],
            # The states in which each button still does something: the page hides one live once
            # the job leaves them (a finished job's page kept "Change class" and "Requeue").
            "actions": {"cancel-form": [s.value for s in ACTIVE_STATES],
                        "requeue-form": [s.value for s in HOLDING_STATES], "class-form": [JobState.QUEUED.value]},
            "socket": f"/ws/jobs/{job.pk}/",
            "time_zone": settings.TIME_ZONE,  # the clock the page's live times are written on
            "api": f"/api/v1/jobs/{job.pk}/",
            # A val, predict or export job has no curves: its results section is refetched when it ends.
            "outcome": reverse("job-outcome", args=[job.pk]) if outcome["mode"] != "train" else None,
        },
    })


@login_required
@never_cache
def job_outcome_view(request, job_id):
    """The results section of a val, predict or export job's page (the page fetches it when the job ends)."""
    job = get_or_404(job_list(user=request.user), job_id, JOB_NOT_VISIBLE)
    return render(request, "portal/_job_outcome.html", {**job_outcome(user=request.user, job=job), "job": job})


def sweep_detail(request, job):
    """A sweep's page (portal/sweep.html, static/portal/sweep.js): drawn from the API's table."""
    sweep = sweep_view(job)
    names = list(sweep["parameters"])
    for row in sweep["rows"]:
        row["param_cells"] = [(name, param_text(row["params"].get(name))) for name in names]
    return render(request, "portal/sweep.html", {
        "job": job, "sweep": sweep, **manager_actions(request.user, job),
        "can_cancel": job.state in ACTIVE_STATES and job_may_cancel(user=request.user, job=job),
        "page_config": {"api": f"/api/v1/jobs/{job.pk}/sweep/", "terminal": [s.value for s in TERMINAL_STATES],
                        "interval_ms": 3000},
    })


def param_text(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "–" if value is None else str(value)


@login_required
@button_only("job", kwarg="job_id")
def job_cancel_view(request, job_id):
    job = get_or_404(job_list(user=request.user), job_id, JOB_NOT_VISIBLE)
    if not job_may_cancel(user=request.user, job=job):
        messages.error(request, "Only the job's owner or a manager of its team may cancel it.")
    elif job.state not in ACTIVE_STATES:
        messages.info(request, f"The job is already {job.state}; nothing to cancel.")
    elif job_cancel(job=job, by=request.user):
        job.refresh_from_db(fields=["state"])
        messages.success(request, "Cancelled." if job.state == JobState.CANCELLED
                         else "Cancel requested; the worker is stopping the training process.")
    return redirect("job", job_id=job.pk)


def manager_actions(user, job) -> dict:
    """The job page's manager buttons: requeue a starting/running job, change a queued job's or an
    active sweep's class (what the API's requeue and the admin's actions offer, to the same people)."""
    manager = job_may_requeue(user=user, job=job)
    return {
        "can_requeue": manager and job.state in HOLDING_STATES and not job.is_sweep,
        # A sweep's class is its queued and later trials' (manager trial 15, F23).
        "can_change_class": manager and (job.state in ACTIVE_STATES if job.is_sweep else job.state == JobState.QUEUED),
        "classes": PriorityClass.values,
    }


@login_required
@button_only("job", kwarg="job_id")
def job_requeue_view(request, job_id):
    """The API's requeue (``JobRequeue``), its rules and messages, from the job page."""
    job = get_or_404(job_list(user=request.user), job_id, JOB_NOT_VISIBLE)
    if not job_may_requeue(user=request.user, job=job):
        messages.error(request, "Only a manager of the job's team may requeue it.")
    elif job.is_sweep:
        messages.error(request, "state: a sweep runs no attempt of its own; requeue one of its trials.")
    elif job.state not in HOLDING_STATES:
        messages.error(request, f"state: the job is {job.state}; only starting or running jobs can be requeued.")
    elif job_requeue(job, reason=f"requeued by {request.user.username}", kind="requeued", by=request.user):
        # It said "resumes from its last checkpoint" of a job that had none (manager trial 15, F20).
        last = job.checkpoints.order_by("-epoch").values_list("epoch", flat=True).first()
        messages.success(request, "Requeued: it resumes from its checkpoint of epoch "
                                  f"{last} when it starts again." if last is not None else
                                  "Requeued: it has no checkpoint yet, so it starts over when it starts again.")
    else:
        messages.error(request, "state: the job changed state meanwhile; try again.")
    return redirect("job", job_id=job.pk)


@login_required
@button_only("job", kwarg="job_id")
def job_class_view(request, job_id):
    """Move a queued job or an active sweep to another priority class (the admin's "Set class" actions, same people)."""
    job = get_or_404(job_list(user=request.user), job_id, JOB_NOT_VISIBLE)
    wanted = request.POST.get("priority_class", "")
    before = job.priority_class
    try:
        changed = job_class_change(job, priority_class=wanted, by=request.user)
    except JobClassRefused as refused:
        messages.error(request, f"{refused.field}: {refused.message}." if refused.field
                       else f"{refused.message[0].upper()}{refused.message[1:]}.")
    else:
        if changed:
            messages.success(request, f"Class changed from {before} to {wanted}.")
        else:
            messages.info(request, f"The job is already {wanted}; nothing changed.")
    return redirect("job", job_id=job.pk)


def submit_refusal(request) -> str:
    """Count a submission against the API's submit throttle; why to refuse it ('' to go on)."""
    wait = throttle_wait(SubmitThrottle(), request)
    if wait is None:
        return ""
    rate = SubmitThrottle().get_rate()
    return f"Too many submissions (the limit is {rate} per user, as in the API): try again in {math.ceil(wait)} s."


@login_required
@button_only("job", kwarg="job_id")
def job_resubmit(request, job_id):
    """Submit the same spec again as a new job (the duplicate check, throttle and cap still apply)."""
    job = get_or_404(job_list(user=request.user), job_id, JOB_NOT_VISIBLE)
    refused = submit_refusal(request)
    if refused:
        return submit_page(request, yaml_form=YamlSpecForm(prefix="y", initial={"spec_text": job.raw_spec}),
                           mode="yaml", refused=refused, status=429)
    try:
        document = load_yaml(job.raw_spec, max_bytes=1 << 20) if job.raw_spec else None
        if not isinstance(document, dict):
            raise SpecError({"spec": "the original spec text is missing; use Edit & resubmit"})
        pinned = team_pinned(job, document)  # the job's team, not the resubmitter's first one
        raw = job.raw_spec if pinned == document else yaml.safe_dump(pinned, sort_keys=False, allow_unicode=True)
        new_job, _ = job_submit(user=request.user, spec=spec_parse(pinned, user=request.user), raw_spec=raw,
                                idempotency_key=request.POST.get("idempotency_key", "")[:200])
    except FieldErrors as exc:  # the stored text's YAML (YamlError) or the spec itself (SpecError)
        messages.error(request, "Could not resubmit: " + "; ".join(f"{k}: {v}" for k, v in exc.errors.items()))
        return redirect(f"{reverse('job-new')}?from={job.pk}")
    except DuplicateJob as dup:
        messages.warning(request, "An identical job of your team is still active; this is it.")
        return redirect("job", job_id=dup.job.pk)
    except TooManyActiveJobs as cap:
        return submit_page(request, yaml_form=YamlSpecForm(prefix="y", initial={"spec_text": job.raw_spec}),
                           mode="yaml", refused=str(cap), status=429)
    messages.success(request, f"Resubmitted as a new job (from {job.task_name}).")
    return redirect("job", job_id=new_job.pk)


# The job page's Continue boxes, by the field a refusal names.
CONTINUE_BOXES = {"timeout": "Timeout (hours)", "memory": "Memory", "gpu": "GPUs", "val": "Validate"}


def _trains_with_val(job) -> bool:
    """Whether ``job``'s training validates each epoch (its val argument; Ultralytics' default is true)."""
    return ((job.spec or {}).get("train_args") or {}).get("val", True) is not False


def _in_hours(field: str, problem) -> str:
    """The timeout limit (which the spec check states in seconds) in the box's unit."""
    return f" ({settings.MAX_JOB_TIMEOUT_S / 3600:g} hours)" if field == "timeout" and "limit is" in str(problem) else ""


@login_required
@button_only("job", kwarg="job_id")
def job_continue_view(request, job_id):
    """Continue an ended training job from its newest stored checkpoint, as a new job (the API's
    jobs/{id}/continue/: apps.jobs.continuation); submit's throttle, duplicate check and cap apply."""
    job = get_or_404(job_list(user=request.user), job_id, JOB_NOT_VISIBLE)
    refused = submit_refusal(request)
    if refused:
        messages.error(request, refused)
        return _continue_again(request, job)
    # In hours, as the submit form's "Timeout (hours)": a page asking in seconds beside a form asking
    # in hours turned a 2 (meant as hours) into a 2-second job killed before its first epoch.
    hours = (request.POST.get("timeout_hours") or "").strip()
    try:
        value = ascii_float(hours) if hours else None
    except ValueError:
        value = math.nan
    if value is not None and (not math.isfinite(value) or value <= 0):
        messages.error(request, f"Could not continue: Timeout (hours): must be a number of hours above 0, "
                                f"got {hours[:20]!r}")
        return _continue_again(request, job)
    if value is not None and value * 3600 > settings.MAX_JOB_TIMEOUT_S:  # 1e308 hours: inf s, a 500 (sec19, F8)
        messages.error(request, f"Could not continue: Timeout (hours): is {hours[:20]} hours; the limit is "
                                f"{settings.MAX_JOB_TIMEOUT_S} s{_in_hours('timeout', 'limit is')}")
        return _continue_again(request, job)
    timeout_s = None if value is None else max(1, round(value * 3600))
    if timeout_s == job.timeout_s:
        timeout_s = None  # unchanged: the spec's own text is kept
    memory = (request.POST.get("memory") or "").strip()[:32]
    if memory == spec_memory(job) or "memory" not in request.POST:
        memory = None  # unchanged (or an older page without the box)
    # The API's gpu (apps.jobs.api.JobContinueIn.validate_gpu): the same parser, the same words.
    gpu_typed = (request.POST.get("gpu") or "").strip()[:32]
    gpus = None
    if gpu_typed and gpu_typed != f"{job.gpus:g}":
        try:
            gpus = parse_gpus(gpu_typed)
        except ValueError as exc:
            messages.error(request, f"Could not continue: {CONTINUE_BOXES['gpu']}: {exc}")
            return _continue_again(request, job)
    # An unticked checkbox is not sent: val_shown says the page had the box (an older page had not).
    val = None
    if "val_shown" in request.POST and (request.POST.get("val") == "true") != _trains_with_val(job):
        val = request.POST.get("val") == "true"
    try:
        new_job, _ = job_continue(job=job, user=request.user, timeout_s=timeout_s, memory=memory, gpus=gpus,
                                  val=val, idempotency_key=request.POST.get("idempotency_key", "")[:200])
    except FieldErrors as exc:  # ContinueRefused, SpecError, IdempotencyKeyReused
        messages.error(request, "Could not continue: " + "; ".join(
            f"{CONTINUE_BOXES.get(field, field)}: {problem}" + _in_hours(field, problem)
            for field, problem in exc.errors.items()))
        return _continue_again(request, job)
    except StorageUnavailable as exc:
        messages.error(request, f"Could not continue: the artifact storage cannot be reached, try again ({exc})")
        return _continue_again(request, job)
    except DuplicateJob as dup:
        messages.warning(request, "An identical job of your team is still active; this is it.")
        return redirect("job", job_id=dup.job.pk)
    except TooManyActiveJobs as cap:
        messages.error(request, f"Could not continue: {cap}")
        return _continue_again(request, job)
    messages.success(request, f"Continuing {job.task_name} from epoch {new_job.epochs_done} as a new job.")
    return redirect("job", job_id=new_job.pk)


def _continue_again(request, job):
    """Back to the job's page after a refused Continue, its boxes holding what was typed (they came
    back with the job's own timeout and memory, the typed values lost: new-user trial 20)."""
    typed = {name: request.POST.get(name, "")[:32] for name in ("timeout_hours", "memory", "gpu") if name in request.POST}
    if "val_shown" in request.POST:
        typed["val"] = "true" if request.POST.get("val") == "true" else "false"
    return redirect(reverse("job", args=[job.pk]) + (f"?{urlencode(typed)}" if typed else "") + "#continue-form")


def form_teams(user) -> dict[str, list[str]]:
    """The submit forms' teams, and those whose urgent class the user may use (Team.urgent_by, the
    rule submit applies: apps.jobs.services.urgent_errors)."""
    teams = list(team_list(user=user))
    return {"teams": [t.slug for t in teams], "urgent_teams": [t.slug for t in teams if not urgent_errors(t, user)]}


def text_in_its_team(job) -> str:
    """``job``'s spec text for Edit & resubmit, naming the job's own team (as Resubmit and Continue
    charge it: apps.jobs.continuation.team_pinned). A text naming no team, or its submitter, was
    charged to whoever submits it again's first team: a member of two teams moved it (sec19; such
    a text is now refused from a member of several teams, trial26)."""
    text = job.raw_spec
    try:
        document = load_yaml(text, max_bytes=1 << 20)
    except FieldErrors:
        return text
    if not isinstance(document, dict) or (pinned := team_pinned(job, document)) == document:
        return text
    if text.lstrip().startswith("{"):
        return json.dumps(pinned, indent=2)
    key = next(k for k in ("team", "user") if pinned.get(k) != document.get(k))
    # The one line changed (or added first), so the text's comments and layout stay.
    edited = (re.sub(rf"^{key}:.*$", f"{key}: {job.team.slug}", text, count=1, flags=re.M) if key in document
              else f"team: {job.team.slug}\n{text}")
    try:
        if load_yaml(edited, max_bytes=1 << 20) == pinned:
            return edited
    except FieldErrors:
        pass
    return yaml.safe_dump(pinned, sort_keys=False, allow_unicode=True)


@login_required
def job_new(request):
    """Submit through the common-fields form or the full YAML spec; errors stay at their field."""
    teams = form_teams(request.user)
    job_form = JobForm(**teams, prefix="f")
    yaml_form = YamlSpecForm(prefix="y", initial={"spec_text": example_spec(teams["teams"])})
    sweep_form = SweepForm(**teams, prefix="s")
    mode = "sweep" if request.GET.get("mode") == "sweep" else "form"
    duplicate_of = None
    if request.method == "GET" and request.GET.get("from"):
        # A malformed id or another team's job is a 404, like the job page itself.
        source = get_or_404(job_list(user=request.user), request.GET["from"], JOB_NOT_VISIBLE)
        if source.raw_spec:
            yaml_form = YamlSpecForm(prefix="y", initial={"spec_text": text_in_its_team(source)})
            mode = "yaml"
    elif request.method == "GET" and request.GET.get("model"):
        # The model page's Evaluate / Predict / Export: that job's spec in the YAML box, to check and submit.
        yaml_form = YamlSpecForm(prefix="y", initial={"spec_text": model_job_spec(request)})
        mode = "yaml"
    refused, status = "", 200
    if request.method == "POST":
        mode = request.POST.get("mode") if request.POST.get("mode") in ("yaml", "sweep") else "form"
        if mode == "yaml":
            form = yaml_form = YamlSpecForm(request.POST, request.FILES, prefix="y")
        elif mode == "sweep":
            form = sweep_form = SweepForm(request.POST, **teams, prefix="s")
        else:
            form = job_form = JobForm(request.POST, **teams, prefix="f")
        refused = submit_refusal(request)
        if refused:
            status = 429
        elif form.is_valid():
            try:
                document = form.spec_document()  # may refuse a field of its own (timeout hours)
                spec = spec_parse(document, user=request.user)
                if form.errors:
                    # Not submitted, but its other problems come in the same answer (trial 16, G9).
                    spec_resolve(spec=spec, user=request.user)
                else:
                    raw = (form.cleaned_data["spec_text"] if mode == "yaml"
                           else yaml.safe_dump(document, sort_keys=False) if mode == "sweep"
                           else json.dumps(document, indent=2))
                    job, _ = job_submit(user=request.user, spec=spec, raw_spec=raw,
                                        idempotency_key=request.POST.get("idempotency_key", "")[:200])
                    messages.success(request, f"Submitted {job.task_name}.")
                    return redirect("job", job_id=job.pk)
            except FieldErrors as exc:  # YamlError or SpecError
                form.add_spec_errors(exc)
            except DuplicateJob as dup:
                duplicate_of = dup.job
            except TooManyActiveJobs as cap:
                refused, status = str(cap), 429
    return submit_page(request, job_form=job_form, yaml_form=yaml_form, sweep_form=sweep_form, mode=mode,
                       duplicate_of=duplicate_of, refused=refused, status=status)


MODEL_JOBS = {"val": "split=val", "predict": "", "export": "format=onnx"}


def model_job_spec(request) -> str:
    """A val, predict or export job of the version ``?model=<id>`` (``?use=``), on the dataset it was
    trained on where that is still the team's, with its training's imgsz (docs/lifecycle.md)."""
    use = request.GET.get("use", "val")
    if use not in MODEL_JOBS:
        raise Http404(f"use= is one of {', '.join(MODEL_JOBS)}")
    version = get_or_404(model_list(user=request.user), request.GET["model"], "No model with that id in your teams.")
    dataset = version.dataset if version.dataset_id and version.dataset.team_id == version.team_id else None
    data = dataset.reference if dataset else "DATASET"
    imgsz = ((version.lineage or {}).get("spec") or {}).get("train_args", {}).get("imgsz")
    args = [f"model={version.reference}"]
    if use != "export":
        args.append(f"{'source' if use == 'predict' else 'data'}={data}")
    args += [a for a in (MODEL_JOBS[use], f"imgsz={imgsz}" if imgsz else "") if a]
    return (f"task_name: {version.name}-v{version.version}-{use}\n"
            f"command: yolo {use} {' '.join(args)}\n"
            f"resources: {{gpu: 1}}\n"
            f"team: {version.team.slug}\n")


def submit_page(request, *, job_form=None, yaml_form=None, sweep_form=None, mode: str = "form", duplicate_of=None,
                refused: str = "", status: int = 200):
    teams = form_teams(request.user)
    return render(request, "portal/submit.html", {
        "job_form": job_form or JobForm(**teams, prefix="f"),
        "yaml_form": yaml_form or YamlSpecForm(prefix="y", initial={"spec_text": example_spec(teams["teams"])}),
        "sweep_form": sweep_form or SweepForm(**teams, prefix="s"),
        "train_args": TRAIN_ARG_NAMES, "sweep_metrics": SWEEP_METRICS,
        "mode": mode, "duplicate_of": duplicate_of, "refused": refused,
        # Each name once: the model's ordering (team, name, -version) made DISTINCT keep one row
        # per version, so a name with two versions was offered twice (trial25).
        "datasets": dataset_list(user=request.user).order_by("name").values_list("name", flat=True).distinct(),
        "models": MODEL_SUGGESTIONS + [f"{m.name}:v{m.version}" for m in model_list(user=request.user)[:50]],
        "idempotency_key": uuid.uuid4().hex,
    }, status=status)


# --- usage, models, tokens -------------------------------------------------------------------


@login_required
def usage(request):
    summary = usage_summary(user=request.user)
    page = report_for_page(request.GET, user=request.user, now=timezone.now())
    group, start, end, rows, errors = page.group, page.start, page.end, page.rows, page.errors
    report = {"group": group, "rows": rows, "from": start, "to": end, "team": page.team,
              "teams": [t.slug for t in team_list(user=request.user)],
              "from_value": request.GET.get("from") or timezone.localdate(start).isoformat(),
              "to_value": request.GET.get("to") or timezone.localdate(end).isoformat(),
              "csv_query": urlencode({"from": start.isoformat(), "to": end.isoformat(), "group": group,
                                      **({"team": page.team} if page.team else {}), "format": "csv"})}
    chart = {**usage_by_day(user=request.user), "quota": summary["me"].get("quota_gpu_hours_24h"),
             "report": {"labels": [f"{r['key']} ({r['team']})" if group == "user" else r["key"] for r in rows], "gpu_hours": [r["gpu_hours"] for r in rows],
                        "wait_p95_min": [round((r["wait_p95_s"] or 0) / 60, 1) for r in rows],
                        "failures": [r["failures"] for r in rows], "preemptions": [r["preemptions"] for r in rows]}}
    if request.user.is_superuser:
        chart["cluster"] = cluster_history(days=30)
    return render(request, "portal/usage.html", {"summary": summary, "chart": chart, "report": report,
                                                 "errors": errors, "groups": GROUPS})


@login_required
def teams(request, pk: int | None = None):
    """The limits in force for the caller's teams (or one of them) and each team's fair-share standing."""
    if pk is None:
        shown = list(standing_teams(user=request.user))
    else:
        shown = [get_or_404(standing_teams(user=request.user), pk, TEAM_NOT_VISIBLE)]
    return render(request, "portal/teams.html", {"standings": team_standings(user=request.user, teams=shown),
                                                 "one": pk is not None})


@login_required
def models(request):
    versions = list(model_list(user=request.user)[:500])
    for version in versions:
        version.headline = headline_metrics(version.metrics or {})
        version.headline_of = headline_of(version.metrics or {})
    return render(request, "portal/models.html", {"versions": versions})


@login_required
@never_cache
def tokens(request):
    """Create tokens with the API's rules (``token_issue``) and throttle (``AuthThrottle``)."""
    new_key = None
    errors: dict[str, str] = {}
    status = 200
    if request.method == "POST":
        name = request.POST.get("name", "").strip() or "cli"
        days_raw = request.POST.get("ttl_days", "").strip()
        days = None
        if days_raw:
            try:
                days = ascii_int(days_raw)
            except ValueError:
                errors["ttl_days"] = f"must be a whole number of days between 1 and {TOKEN_MAX_DAYS}"
        wait = None if errors else throttle_wait(AuthThrottle(), request)
        if wait is not None:
            errors["name"] = f"Too many tokens created: try again in {math.ceil(wait)} s."
            status = 429
        elif not errors:
            try:
                _, new_key = token_issue(user=request.user, name=name, expires_in_days=days)
            except FieldErrors as exc:
                errors = {("ttl_days" if key == "expires_in_days" else key): message
                          for key, message in exc.errors.items()}
        if errors and status == 200:
            status = 400
    # A refused form comes back as typed (the name emptied and the days reset: new-user trial 20).
    typed = {"name": request.POST.get("name", "")[:100], "ttl_days": request.POST.get("ttl_days", "")[:20]} \
        if errors else {}
    return render(request, "portal/tokens.html", {
        "tokens": token_list(user=request.user), "new_key": new_key, "errors": errors, "typed": typed,
        "server_url": request.build_absolute_uri("/").rstrip("/"),
        "default_days": settings.API_TOKEN_DEFAULT_DAYS,
    }, status=status)


@login_required
@button_only("tokens")
def token_revoke_view(request, pk: int):
    token = get_or_404(token_list(user=request.user), pk, "No such token.")
    token_revoke(token=token)
    messages.success(request, f"Token {token.key_prefix}… revoked.")
    return redirect("tokens")


# --- sign out ---------------------------------------------------------------------------------


@never_cache
def sign_out(request):
    """GET asks (Django only signs out on POST, against cross-site log-outs); POST signs out."""
    if request.method == "POST":
        logout(request)
        return redirect("login")
    if not request.user.is_authenticated:
        return redirect("login")
    return render(request, "registration/logout_confirm.html")
