"""Typed readers for environment variables that fail loudly on a bad value."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from urllib.parse import parse_qsl, quote, unquote, urlparse


class EnvError(ValueError):
    pass


def env_str(name: str, default: str = "") -> str:
    """Unset or empty is the default, as for the other readers: Docker Compose passes
    ``${NAME:-}`` as "" (NOTIFY_SMTP_SECURITY="" stopped every process: operator trial 29)."""
    return os.environ.get(name) or default


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise EnvError(f"{name}={raw!r} is not a boolean (use true/false, 1/0, yes/no, on/off)")


def env_int(name: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise EnvError(f"{name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise EnvError(f"{name}={value} is below the minimum {minimum}")
    if maximum is not None and value > maximum:
        raise EnvError(f"{name}={value} is above the maximum {maximum}")
    return value


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise EnvError(f"{name}={raw!r} is not a number") from None
    if minimum is not None and value < minimum:
        raise EnvError(f"{name}={value} is below the minimum {minimum}")
    return value


RATE = re.compile(r"[0-9]+/[smhd][a-z]*")


def env_rate(name: str, default: str) -> str:
    """A throttle rate as DRF reads it (``120/min``: a count, ``/``, a period whose first letter is
    s, m, h or d). DRF reads it only at a request, so a bad one was a 500 on every request it
    throttles (every submit, every sign-in) instead of a refusal to start."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip()
    if not RATE.fullmatch(value):
        raise EnvError(f"{name}={raw!r} is not a rate: use a count per s, min, hour or day, e.g. 120/min")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_path(name: str, default: Path) -> Path:
    raw = os.environ.get(name)
    return Path(raw).expanduser().resolve() if raw else default


def shown_url(url: str) -> str:
    """``url`` with its password as ``***``: what an error about it may print (logs, a pod's events).

    Everything from the user's ``:`` to the last ``@`` is masked, not only what urlparse reads as the
    password: a ``#``, ``?`` or ``/`` left in one (not percent-encoded) ends the authority there, and
    the rest of the password was printed as a path, a query or a fragment."""
    return _PASSWORD.sub(r"\1:***@", url, count=1)


_PASSWORD = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://[^:/?#@]*):.*@", re.DOTALL)


def parse_database_url(url: str, *, prepared_statements: bool = True) -> dict:
    """``sqlite:///abs/path.db``, ``postgres://user:pw@host:port/name`` → Django DATABASES entry.

    ``prepared_statements`` (PostgreSQL): whether apps/core/prepared.py's hot statements are
    prepared on the server (DATABASE_PREPARED_STATEMENTS).

    A query (``?sslmode=require``) is refused rather than dropped: nothing reads it, and an
    operator who asked for TLS must not get a plain connection. PostgreSQL's connection options
    come from libpq's environment variables (``PGSSLMODE``, ``PGSSLROOTCERT``, …), which psycopg
    and ``pg_dump`` (``manage.py backup``) both read."""
    parsed = urlparse(url)
    if parsed.query:
        # Named from the URL as shown: a '?' in a password (not percent-encoded) starts a "query" too.
        query = urlparse(shown_url(url)).query
        names = ", ".join(sorted({key for key, _ in parse_qsl(query, keep_blank_values=True)}))
        raise EnvError(
            f"DATABASE_URL has query parameters ({names or query[:50] or 'a ? in its password: write it as %3F'}), "
            "which are not read: give "
            "PostgreSQL's connection options as libpq environment variables instead (PGSSLMODE=require, "
            "PGSSLROOTCERT=..., PGCONNECT_TIMEOUT=...)"
        )
    if parsed.scheme == "sqlite":
        path = unquote(parsed.path)
        if url.startswith("sqlite:////"):
            path = "/" + path.lstrip("/")
        elif url.startswith("sqlite:///"):
            path = path[1:] if path.startswith("/") else path
        if not path:
            raise EnvError(f"DATABASE_URL={url!r} has no file path")
        return {
            "ENGINE": "yoloportal.backends.sqlite3",  # Django's, with in-process write queueing
            "NAME": str(Path(path).resolve()),
            # Several processes (web, scheduler, worker, training monitor) share the file:
            # WAL lets readers run beside the writer; IMMEDIATE takes the write lock up
            # front so two writers queue on the busy timeout instead of deadlocking.
            # Kept open between requests like PostgreSQL's (a reconnect runs the PRAGMAs again).
            "CONN_MAX_AGE": 60,
            "OPTIONS": {
                "timeout": 30,
                "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    if parsed.scheme in {"postgres", "postgresql", "pgsql"}:
        name = parsed.path.lstrip("/")
        if not name:
            raise EnvError(f"DATABASE_URL={shown_url(url)!r} names no database")
        try:
            port = parsed.port
        except ValueError:  # urllib's message quotes the "port": a password's start where it holds a '/'
            raise EnvError(f"DATABASE_URL={shown_url(url)!r} has a port that is no number up to 65535 (a '/' in a "
                           "password is written %2F)") from None
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": unquote(name),
            "USER": unquote(parsed.username or ""),
            "PASSWORD": unquote(parsed.password or ""),
            "HOST": parsed.hostname or "",
            "PORT": str(port or ""),
            "CONN_MAX_AGE": 60,
            # psycopg prepares a statement on the server after this many runs on a connection,
            # so the server stops parsing and planning it each time (about a third of its
            # backend's CPU per submit: docs/performance.md, item 23). Only the statements that
            # apps/core/prepared.py sends bind their parameters on the server and can be
            # prepared; every other query keeps Django's default (client-side binding, never
            # prepared). None (DATABASE_PREPARED_STATEMENTS=false): nothing is prepared, for a
            # pooler that cannot keep prepared statements (PgBouncer in transaction mode
            # before 1.21, or without max_prepared_statements).
            "OPTIONS": {"prepare_threshold": 5 if prepared_statements else None},
        }
    raise EnvError(
        f"DATABASE_URL={shown_url(url)!r}: unsupported scheme {parsed.scheme!r} (use sqlite:// or postgres://)"
    )


def database_url(entry: dict) -> str:
    """The inverse of :func:`parse_database_url`: a DATABASES entry → ``DATABASE_URL``.

    Tests hand their (test) database to the processes they start this way.
    """
    if entry["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{entry['NAME']}"
    if entry["ENGINE"].endswith("postgresql"):
        auth = ""
        if entry.get("USER"):
            auth = quote(entry["USER"], safe="")
            if entry.get("PASSWORD"):
                auth += ":" + quote(entry["PASSWORD"], safe="")
            auth += "@"
        port = f":{entry['PORT']}" if entry.get("PORT") else ""
        return f"postgres://{auth}{entry.get('HOST') or ''}{port}/{quote(entry['NAME'], safe='')}"
    raise EnvError(f"no URL form for the database engine {entry['ENGINE']!r}")


def checkout_tag(base_dir: Path) -> str:
    """A short, stable tag for a checkout folder (a PostgreSQL identifier fragment)."""
    return hashlib.sha1(str(base_dir).encode()).hexdigest()[:8]
