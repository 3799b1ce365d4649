"""Scoped reads: a row by id among what the caller may see, written once."""

from __future__ import annotations

from typing import Any, TypeVar

from django.core.exceptions import ValidationError
from django.db.models import Model, QuerySet
from django.http import Http404

M = TypeVar("M", bound=Model)


def scoped_get(rows: QuerySet[M], pk: Any) -> M | None:
    """The row with primary key ``pk`` among ``rows`` (a selector's caller-scoped queryset),
    or None when it is not there or ``pk`` is malformed."""
    try:
        return rows.filter(pk=pk).first()
    except (TypeError, ValueError, ValidationError):  # ValidationError: a malformed UUID
        return None


def one_or_none(rows: QuerySet[M]) -> M | None:
    """The row a lookup on a unique key finds, or None: ``.first()`` without the ORDER BY it
    adds (one row has no order, and the ORM builds that clause anew on every call; on a hot
    path such as token authentication it is a third of the query's CPU)."""
    return next(iter(rows[:1]), None)


def get_or_404(rows: QuerySet[M], pk: Any, message: str) -> M:
    """:func:`scoped_get` or a 404 saying ``message``, the same whether the row does not
    exist or belongs to a team the caller cannot see. Pages show Django's 404; the API
    answers ``{"detail": message}`` (DRF turns Http404 into NotFound with its message)."""
    row = scoped_get(rows, pk)
    if row is None:
        raise Http404(message)
    return row
