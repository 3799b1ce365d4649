"""Structured logs: ``LOG_FORMAT=json`` makes every process (web, scheduler, workers) write one
JSON object per line, with the context it knows — ``request_id`` in the web process,
``node`` in a worker, ``job_id``/``attempt`` while a worker runs an attempt — plus any
of those passed as ``extra=`` on a single call.

Standard library only: a contextvar holds the context, a filter copies it onto each
record when it is emitted (so it survives handlers that format later), the formatter
writes JSON.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from types import MappingProxyType

CONTEXT_FIELDS = ("request_id", "job_id", "attempt", "node", "component")
_context: contextvars.ContextVar[Mapping] = contextvars.ContextVar("yoloportal_log_context",
                                                                   default=MappingProxyType({}))


def bind(**fields) -> contextvars.Token:
    """Add fields to this context (a process, thread or task) until reset."""
    return _context.set({**_context.get(), **{k: v for k, v in fields.items() if v is not None}})


def reset(token: contextvars.Token) -> None:
    _context.reset(token)


@contextlib.contextmanager
def log_context(**fields) -> Iterator[None]:
    token = bind(**fields)
    try:
        yield
    finally:
        reset(token)


def current() -> dict:
    return dict(_context.get())


class ContextFilter(logging.Filter):
    """Copies the bound context onto the record (an explicit ``extra=`` wins)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in _context.get().items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


class DeniedWithoutTraceback(logging.Filter):
    """On ``django.request``: a 403 (PermissionDenied) is one line, not one line and its traceback.

    A manager opening an admin page that is superusers' only is an answer, not a fault; the
    ~40-line traceback per 403 drowned the web log (trial 14, F8). The line keeps the path."""

    def filter(self, record: logging.LogRecord) -> bool:
        from django.core.exceptions import PermissionDenied

        if record.exc_info and isinstance(record.exc_info[1], PermissionDenied):
            record.exc_info = None
            record.exc_text = None
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        request = getattr(record, "request", None)  # django.request passes it; logged after the middleware
        if getattr(record, "request_id", None) is None and getattr(request, "request_id", None):
            record.request_id = request.request_id
        for key in CONTEXT_FIELDS:
            value = getattr(record, key, None)
            if value is not None:
                entry[key] = value if isinstance(value, int | float | bool) else str(value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def logging_config(*, log_format: str, level: str) -> dict:
    if log_format not in {"plain", "json"}:
        from yoloportal.env import EnvError

        raise EnvError(f"LOG_FORMAT={log_format!r} must be plain or json")
    if not isinstance(logging.getLevelName(level.upper()), int):
        from yoloportal.env import EnvError

        # dictConfig said only "Unable to configure root logger", naming no variable.
        raise EnvError(f"LOG_LEVEL={level!r} must be DEBUG, INFO, WARNING, ERROR or CRITICAL")
    level = level.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"context": {"()": "yoloportal.logs.ContextFilter"},
                    "denied": {"()": "yoloportal.logs.DeniedWithoutTraceback"},
                    "redis_outage": {"()": "apps.core.redis_outage.QuietRedisOutage"}},
        "formatters": {
            "plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
            "json": {"()": "yoloportal.logs.JsonFormatter"},
        },
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": log_format, "filters": ["context"]}},
        "root": {"handlers": ["console"], "level": level},
        "loggers": {"django.db.backends": {"level": "WARNING"}, "django.request": {"filters": ["denied"]},
                    # A lost Redis is one line per process (apps/core/redis_outage.py), not RQ's tracebacks.
                    **{name: {"filters": ["redis_outage"]} for name in ("rq.worker", "rq.scheduler", "rq.job")}},
    }
