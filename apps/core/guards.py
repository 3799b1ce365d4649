"""Deletion guards: an app below another asks it whether a row may go, without importing it.

A dataset version or a model version that an active job will still read must not be deleted
(the job failed later with "dataset YAML not found … check the dataset", or trained from a
version deleted while it waited: manager trial). ``apps.jobs`` knows which jobs use what; the
datasets and registry apps sit below it. So ``apps.jobs`` registers a guard here (its
``AppConfig.ready``) and the deleting code asks :func:`deletion_refusal`.
"""

from __future__ import annotations

from collections.abc import Callable

_GUARDS: dict[type, list[Callable[[object], str | None]]] = {}


class InUse(Exception):
    """The row is still needed; the message says by what and what to do (an API answers 409)."""


def guard_deletion(model: type, check: Callable[[object], str | None]) -> None:
    """Register ``check(obj)`` → why ``obj`` may not be deleted now, or None."""
    _GUARDS.setdefault(model, []).append(check)


def deletion_refusal(obj) -> str | None:
    for check in _GUARDS.get(type(obj), ()):
        if reason := check(obj):
            return reason
    return None


def ensure_deletable(obj) -> None:
    if reason := deletion_refusal(obj):
        raise InUse(reason)
