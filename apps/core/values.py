"""Plain values: what JSON (an audit entry's data, an event's payload) can hold, and reading them."""

from __future__ import annotations

import re
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


_SURROGATE = re.compile("[\ud800-\udfff]")


def _surrogate_free(text: str) -> str:
    """``text`` with each lone surrogate written as its escape, so that the name can be answered."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def first_surrogate(value: Any, path: str = "") -> tuple[str, str] | None:
    """(path, problem) of the first key or string holding a lone UTF-16 surrogate, else None.

    A JSON ``"\\ud800"`` escape, or a YAML one, decodes to a string UTF-8 cannot write: stored in a
    job's spec or a dataset's class names, every answer that included it was a 500 — the team's whole
    job or dataset list, not only the request that sent it (new-user trial 27, F1). ``path`` is the
    field's as the API names fields (``description``, ``resources.gpu``, ``names[0]``); a key holding
    one is named with the surrogate escaped.
    """
    if isinstance(value, str):
        if found := _SURROGATE.search(value):
            # The path is escaped here, once it is answered: a key on it may hold the surrogate.
            return _surrogate_free(path), (f"holds a lone UTF-16 surrogate (U+{ord(found.group()):04X}), which is no character: "
                          "send the text as UTF-8 (a JSON or YAML \\u escape of half a pair is refused)")
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if isinstance(key, str) and (found := first_surrogate(key, where)):
                return found
            if found := first_surrogate(item, where):
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            if found := first_surrogate(item, f"{path}[{index}]"):
                return found
    return None
