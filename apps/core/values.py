"""Plain values: what JSON (an audit entry's data, an event's payload) can hold, and reading them."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Literal


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


def ascii_int(text: str) -> int:
    """``int(text)`` of ASCII text only; a ValueError otherwise, as ``int()`` raises for text.

    ``int()`` and ``float()`` read any script's digits and any Unicode space around them: ``?limit=２``
    (fullwidth) or ``epochs: "٣"`` were taken as 2 and 3, while every page and answer showed the text.
    Every parse of a caller's text into a number goes through these two.
    """
    if not text.isascii():
        raise ValueError(f"not ASCII digits: {text[:50]!r}")
    return int(text)


def ascii_float(text: str) -> float:
    """``float(text)`` of ASCII text only (see :func:`ascii_int`)."""
    if not text.isascii():
        raise ValueError(f"not ASCII digits: {text[:50]!r}")
    return float(text)


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


KeyNamed = Literal["itself", "by_its_mapping"]


def first_found(
    document: Any, find: Callable[[Any], Any], *, among: type | tuple[type, ...], key_named: KeyNamed = "itself"
) -> tuple[str, Any] | None:
    """(path, what ``find`` answered) for the first key or value of type ``among`` that ``find``
    answers truthily for, walking mappings and lists in order; None when there is none.

    ``path`` is the field's as the API names fields: ``description``, ``resources.gpu``, ``names[0]``,
    "" for the document itself. A key found is named by its own path (``key_named="itself"``) or, where
    a key cannot be written out (a NUL, a number too long), by its mapping's (``"by_its_mapping"``).
    The path is built only for the answer: every JSON body and YAML spec pays the walk.
    """
    if isinstance(document, among):
        found = find(document)
        return ("", found) if found else None
    if not isinstance(document, (dict, list)):
        return None
    hit = _first_found(document, find, among, key_named == "itself")
    if hit is None:
        return None
    found, steps = hit
    path = ""
    for is_index, step in reversed(steps):
        if is_index:
            path = f"{path}[{step}]"
        else:
            path = f"{path}.{step}" if path else str(step)
    return path, found


def _first_found(
    container: dict | list, find: Callable[[Any], Any], among: type | tuple[type, ...], key_named_itself: bool
) -> tuple[Any, list[tuple[bool, Any]]] | None:
    """(what ``find`` answered, the steps to it from the innermost out: (is an index, key or index)).
    A leaf is tested in its container's loop rather than in a call of its own: most of a walk is leaves."""
    if isinstance(container, dict):
        for key, item in container.items():
            if isinstance(key, among) and (found := find(key)):
                return found, [(False, key)] if key_named_itself else []
            if isinstance(item, among):
                if found := find(item):
                    return found, [(False, key)]
            elif isinstance(item, (dict, list)) and (hit := _first_found(item, find, among, key_named_itself)):
                hit[1].append((False, key))
                return hit
    else:
        for index, item in enumerate(container):
            if isinstance(item, among):
                if found := find(item):
                    return found, [(True, index)]
            elif isinstance(item, (dict, list)) and (hit := _first_found(item, find, among, key_named_itself)):
                hit[1].append((True, index))
                return hit
    return None


_SURROGATE = re.compile("[\ud800-\udfff]")


def _surrogate_free(text: str) -> str:
    """``text`` with each lone surrogate written as its escape, so that the name can be answered."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def first_surrogate(value: Any) -> tuple[str, str] | None:
    """(path, problem) of the first key or string holding a lone UTF-16 surrogate, else None.

    A JSON ``"\\ud800"`` escape, or a YAML one, decodes to a string UTF-8 cannot write: stored in a
    job's spec or a dataset's class names, every answer that included it was a 500 — the team's whole
    job or dataset list, not only the request that sent it (new-user trial 27, F1). ``path`` is as
    :func:`first_found` names it; a key holding one is named with the surrogate escaped.
    """
    if found := first_found(value, _SURROGATE.search, among=str):
        path, surrogate = found
        return _surrogate_free(path), (
            f"holds a lone UTF-16 surrogate (U+{ord(surrogate.group()):04X}), which is no "
            "character: send the text as UTF-8 (a JSON or YAML \\u escape of half a pair "
            "is refused)"
        )
    return None
