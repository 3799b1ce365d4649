"""What active jobs still need, as deletion guards (:mod:`apps.core.guards`)."""

from __future__ import annotations

from django.db.models import Q

from .models import ACTIVE_STATES, Job

SHOWN = 3


def _refusal(what: str, jobs) -> str | None:
    rows = list(jobs.order_by("created_at").values_list("task_name", "state")[: SHOWN + 1])
    if not rows:
        return None
    count = jobs.count() if len(rows) > SHOWN else len(rows)
    named = ", ".join(f"{name} ({state})" for name, state in rows[:SHOWN]) + (" …" if count > SHOWN else "")
    return (f"{what} is used by {count} active job{'s' if count != 1 else ''} of the team ({named}): cancel "
            f"{'them' if count != 1 else 'it'} or let {'them' if count != 1 else 'it'} finish first")


def dataset_refusal(dataset) -> str | None:
    """A queued or running job reads this version (its data, or a predict job's source)."""
    jobs = Job.objects.filter(team_id=dataset.team_id, state__in=ACTIVE_STATES).filter(
        Q(spec__inputs__data__id=dataset.pk) | Q(spec__inputs__source__id=dataset.pk))
    return _refusal(f"dataset {dataset.reference}", jobs)


def model_version_refusal(version) -> str | None:
    """A queued or running job starts from, evaluates, predicts with or exports this version."""
    jobs = Job.objects.filter(team_id=version.team_id, state__in=ACTIVE_STATES,
                              spec__inputs__model__kind="version", spec__inputs__model__id=version.pk)
    return _refusal(f"model {version.reference}", jobs)


def register() -> None:
    from apps.core.guards import guard_deletion
    from apps.datasets.models import Dataset
    from apps.registry.models import ModelVersion

    guard_deletion(Dataset, dataset_refusal)
    guard_deletion(ModelVersion, model_version_refusal)
