"""The one shape of a refusal inside the code: field path → what is wrong with it."""

from __future__ import annotations


class FieldErrors(ValueError):
    """Validation failed; ``errors`` maps field paths to messages (``{"command.epochs": "must be …"}``).

    The API answers these as a 400 with the same keys (``apps.core.api.field_errors``).
    """

    def __init__(self, errors: dict[str, str]):
        self.errors = errors
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))


# What SQLite says when it did not answer (its write lock held past the busy timeout by another
# process, the file unreachable), as opposed to an error in what was asked of it.
SQLITE_UNANSWERED = ("database is locked", "database table is locked", "unable to open database", "disk I/O error")


def database_unanswered(exc: BaseException) -> bool:
    """Whether ``exc`` says the database did not answer — SQLite's lock held past the busy timeout,
    a PostgreSQL connection refused or lost, a statement cancelled by its timeout, a restart or a
    failover — so the caller may wait and try again (the API's 503, a training worker riding out
    the outage). An error in what was asked (SQLite's "no such table"/"no such column", bad SQL:
    a missing migration, a bug) is not: it stays a 500 and ends an attempt at once.
    """
    from django.db import InterfaceError, OperationalError  # errors.py is imported before Django's setup

    if isinstance(exc, InterfaceError):
        return True
    if not isinstance(exc, OperationalError):
        return False
    if exc.__cause__ is None or type(exc.__cause__).__module__.startswith("sqlite3"):
        return any(words in str(exc) for words in SQLITE_UNANSWERED)
    return True  # psycopg: an OperationalError is the connection's or a timeout's; SQL errors are other classes
