from __future__ import annotations

from django.db.models import QuerySet

from apps.accounts.selectors import team_ids
from apps.core.selectors import scoped_get

from .models import ModelVersion


def model_list(*, user) -> QuerySet[ModelVersion]:
    return ModelVersion.objects.filter(team_id__in=team_ids(user=user)).select_related("team", "job")


def model_get(*, user, pk) -> ModelVersion | None:
    return scoped_get(model_list(user=user), pk)
