"""Plain values: what JSON (an audit entry's data, an event's payload) can hold, and reading them."""

from __future__ import annotations

from typing import Any


def plain_value(value: Any) -> Any:
    """A form value as something an audit entry's JSON can hold."""
    return value if isinstance(value, (int, float, bool, str, type(None))) else str(value)


def bool_parse(value: Any) -> bool:
    """A YAML/CLI boolean: true/false as a bool or a string (any case); anything else is an error."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in {"true", "false"}:
        return value.lower() == "true"
    raise ValueError(f"must be true or false, got {value!r}")


def bytes_in_words(size: int | None) -> str:
    """A file size as people read it, with the exact count: "5.9 MiB (6,190,186 bytes)" (binary
    units, as the portal shows GPU memory; admin showed a bare "6190186", manager trial 15, F27)."""
    if size is None:
        return "-"
    value, unit = float(size), "bytes"
    for bigger in ("KiB", "MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    if unit == "bytes":
        return f"{size:,} bytes"
    return f"{value:.1f} {unit} ({size:,} bytes)"
