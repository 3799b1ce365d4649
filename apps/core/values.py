"""Plain values: what JSON (an audit entry's data, an event's payload) can hold."""

from __future__ import annotations

from typing import Any


def plain_value(value: Any) -> Any:
    """A form value as something an audit entry's JSON can hold."""
    return value if isinstance(value, (int, float, bool, str, type(None))) else str(value)
