from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.db.models import Q, QuerySet

from apps.accounts.selectors import team_ids
from apps.core.artifacts import ArtifactKeyError, artifact_key, artifact_path, key_join, root_path
from apps.core.hashing import file_sha256
from apps.core.prepared import PreparedRead
from apps.core.selectors import scoped_get
from apps.core.storage import shared_filesystem

from .models import Evaluation, Export, ModelVersion, PredictionRun, SharedWeights


def model_list(*, user, team: str | None = None, name: str | None = None) -> QuerySet[ModelVersion]:
    versions = ModelVersion.objects.filter(team_id__in=team_ids(user=user)).select_related(
        "team", "job", "dataset", "parent")
    if team:
        versions = versions.filter(team__slug=team)
    if name:
        versions = versions.filter(name=name)
    return versions


def model_get(*, user, pk) -> ModelVersion | None:
    return scoped_get(model_list(user=user), pk)


def _of_teams(ids) -> Q:
    """A version's result in the user's teams; one of weights that are no version: its job's team."""
    return Q(version__team_id__in=ids) | Q(version__isnull=True, job__team_id__in=ids)


def export_list(*, user) -> QuerySet[Export]:
    return Export.objects.filter(_of_teams(team_ids(user=user))).select_related("version__team", "job")


def evaluation_list(*, user) -> QuerySet[Evaluation]:
    return Evaluation.objects.filter(_of_teams(team_ids(user=user))).select_related("version__team", "job")


def prediction_list(*, user) -> QuerySet[PredictionRun]:
    return PredictionRun.objects.filter(job__team_id__in=team_ids(user=user)).select_related("job", "version")


def predictions_missing_why(*, user, job_id) -> str | None:
    """Why a job of the user's teams has no predictions, in words; None for a job they do not see.

    ``jobs/{id}/predictions/`` of a queued predict job, or of a training, answered "No predictions for
    that job in your teams." — read as "not your job" by the job's own submitter (new-user trial 27, F3).
    """
    job_model = PredictionRun._meta.get_field("job").related_model  # the jobs app's Job: registry imports no job app
    job = job_model.objects.filter(pk=job_id, team_id__in=team_ids(user=user)).only(
        "task_name", "state", "spec").first()
    if job is None:
        return None
    name, mode = f"{job.task_name} ({str(job.pk)[:8]})", (job.spec or {}).get("mode") or "train"
    state = job.state.replace("_", " ")
    if mode != "predict":
        return f"{name} is {'an' if mode[0] in 'aeiou' else 'a'} {mode} job: only a predict job (yolo predict …) has predictions."
    if job.state in ("queued", "starting", "running"):
        return f"{name} is {state}: its predictions are here once it has succeeded."
    if job.state != "succeeded":
        return f"{name} {state}: a predict job keeps its predictions only when it succeeds (its log says why)."
    return f"{name} succeeded but recorded no predictions."


# Asked at every training's submit: compiled once per connection (apps.core.prepared; as a queryset
# it added ~0.5 ms of CPU to a submit, a tenth of it).
NAME_TASKS = PreparedRead(
    lambda team_id, name: ModelVersion.objects.filter(team_id=team_id, name=name).exclude(task="")
    .order_by("-version").values_list("task", "version")[:50],
    samples=({"team_id": 1, "name": "a"}, {"team_id": 2, "name": "b"}))


def model_name_task_ahead(*, team, name: str) -> list[tuple[PreparedRead, dict[str, Any]]]:
    """The prepared read :func:`model_name_task` makes, so a submit can read it ahead with its other
    reads (``apps.core.prepared.reads_ahead``)."""
    return [(NAME_TASKS, {"team_id": team.pk, "name": name})]


def model_name_task(*, team, name: str) -> tuple[str, list[str]]:
    """(the task of the newest of ``name``'s versions that records one, their references), or
    ("", []) when the name has no version of a known task yet. Every version of a name is one
    task (apps.jobs.services.registry_task_errors), so ``name:latest`` never switches task."""
    rows = NAME_TASKS(team_id=team.pk, name=name)
    if not rows:
        return "", []
    task = rows[0][0]
    return task, [f"{name}:v{version}" for known, version in rows if known == task]


# --- what a spec's model= means ----------------------------------------------------------------


@dataclass(frozen=True)
class WeightsRef:
    """Resolved weights: the key the child loads, its hash, and what lineage records of it."""

    key: str
    sha256: str
    parent: dict  # {"kind": "version" | "shared" | "team-file", …, "sha256"}
    version: ModelVersion | None = None
    task: str = ""
    # The model's class names by id when known without loading it: a version's, or what the
    # checkpoint scan read from shared weights (SharedWeights.scan); None when not known.
    class_names: list[str] | None = None


_VERSION_REF = re.compile(r"^([\w.-]+):(?:v(\d+)|latest|(staging|production))$")


def version_resolve(*, team, reference: str) -> ModelVersion:
    """``name:v3``, ``name:latest``, ``name:production``/``name:staging`` → a version of the team's. ValueError."""
    match = _VERSION_REF.fullmatch(reference)
    if not match:
        raise ValueError("must be a registered model: name:v1, name:latest, name:staging or name:production")
    name, number, stage = match.groups()
    versions = ModelVersion.objects.filter(team=team, name=name).select_related("team")
    if number:
        found = versions.filter(version=int(number)).first()
    elif stage:
        found = versions.filter(stage=stage).order_by("-version").first()
    else:
        found = versions.order_by("-version").first()
    if found is None:
        known = ", ".join(f"v{v}" for v in versions.order_by("version").values_list("version", flat=True)[:20])
        if known:
            raise ValueError(f"no registered model {reference!r} in your team ({name} has {known})")
        # A name the team has no version of: the closest ones it has (a typo, or "portal ft" typed as
        # "portal-ft" for a version registered before trial 20).
        names = sorted(set(ModelVersion.objects.filter(team=team).values_list("name", flat=True)))
        close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
        raise ValueError(f"no registered model {reference!r} in your team"
                         + (f"; did you mean {' or '.join(close)}? (yoloq model list)" if close else ""))
    if not found.weights_key:
        raise ValueError(f"model {found.reference} has no weights file any more")
    return found


def version_weights(version: ModelVersion) -> WeightsRef:
    return WeightsRef(key=version.weights_key, sha256=version.sha256, parent=version.as_parent(), version=version,
                      task=version.task)


def weights_resolve(*, team, reference: str) -> WeightsRef:
    """``name.pt`` → the team's uploaded weights, else its own folder, else the shared store. ValueError.

    1. The newest version the team *uploaded* under that file name (``yoloq weights push``).
    2. The team's folder ``weights/<team>/``: any path inside it, symlinks resolved.
    3. The shared store: a bare file name only, a regular file directly in ``weights/``
       (after resolving symlinks). Team folders live inside it too, so a path with a ``/``
       must never reach the shared fallback: ``robotics/secret.pt`` would be another
       team's weights (issue 9, finding 1).
    """
    uploaded = ModelVersion.objects.filter(team=team, source=ModelVersion.Source.UPLOAD, filename=reference) \
        .select_related("team").order_by("-version").first()
    if uploaded is not None and uploaded.weights_key:
        return version_weights(uploaded)
    own = artifact_path(key_join("weights", team.slug)).resolve()
    path = (own / reference).resolve()
    if path.is_relative_to(own) and path.is_file():
        return WeightsRef(key=artifact_key(path), sha256=file_sha256(path),
                          parent={"kind": "team-file", "name": reference, "sha256": ""})
    if "/" in reference:
        raise ValueError(
            f"weights {reference!r} are not in your team's weights; shared weights are named by a "
            "bare file name (e.g. yolov8n.pt), and other teams' weights are not readable"
        )
    if not shared_filesystem():
        # An object store: shared weights are what their rows say (shared_weights_add stored them
        # there); this machine's own weights/ folder is not what the GPU servers read.
        row = SharedWeights.objects.filter(filename=reference).first()
        if row is not None:
            return WeightsRef(key=row.key, sha256=row.sha256, task=row.task, class_names=row.scan.get("class_names"),
                              parent={"kind": "shared", "name": reference, "sha256": row.sha256})
    shared_root = root_path("weights")
    path = (shared_root / reference).resolve()
    if path.parent == shared_root and path.is_file():
        row = SharedWeights.objects.filter(filename=reference).first()
        sha256 = row.sha256 if row is not None and row.size == path.stat().st_size else file_sha256(path)
        # The row's scan describes these bytes only while the hashes agree (a file replaced
        # by hand beside the command is not what was scanned).
        scanned = row is not None and row.sha256 == sha256
        return WeightsRef(key=artifact_key(path), sha256=sha256, task=row.task if row else "",
                          class_names=row.scan.get("class_names") if scanned else None,
                          parent={"kind": "shared", "name": reference, "sha256": sha256})
    raise ValueError(
        f"weights {reference!r} are neither your team's nor shared; nothing is downloaded here — upload them "
        "(yoloq weights push FILE), use a model YAML (e.g. yolov8n.yaml) or a registered model (name:v1)"
    )


def weights_file(key: str) -> Path | None:
    """The local file of a weights key, or None when it is gone or the key is not one."""
    try:
        path = artifact_path(key)
    except ArtifactKeyError:
        return None
    return path if path.is_file() else None
