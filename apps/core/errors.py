"""The one shape of a refusal inside the code: field path → what is wrong with it."""

from __future__ import annotations


class FieldErrors(ValueError):
    """Validation failed; ``errors`` maps field paths to messages (``{"command.epochs": "must be …"}``).

    The API answers these as a 400 with the same keys (``apps.core.api.field_errors``).
    """

    def __init__(self, errors: dict[str, str]):
        self.errors = errors
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))
