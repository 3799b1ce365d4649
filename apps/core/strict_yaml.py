"""Parsing untrusted YAML: a size cap first, then a safe loader without anchors, aliases or deep nesting."""

from __future__ import annotations

from typing import Any

import yaml

from .errors import FieldErrors


class YamlError(FieldErrors):
    """The text is not acceptable YAML; ``errors`` holds one message under the caller's field name."""


class _StrictSafeLoader(yaml.SafeLoader):
    """Safe loader that refuses anchors/aliases (billion laughs) and deep nesting."""

    max_depth = 20

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.constructor.ConstructorError(
                None, None, "YAML aliases (*name) are not allowed", event.start_mark
            )
        event = self.peek_event()
        if getattr(event, "anchor", None):
            raise yaml.constructor.ConstructorError(
                None, None, "YAML anchors (&name) are not allowed", event.start_mark
            )
        self._depth = getattr(self, "_depth", 0) + 1
        try:
            if self._depth > self.max_depth:
                raise yaml.constructor.ConstructorError(
                    None, None, f"nesting deeper than {self.max_depth} levels", event.start_mark
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def load_yaml(text: str | bytes, *, max_bytes: int, field: str = "spec") -> Any:
    """Parse untrusted YAML: size cap first, then the strict safe loader. Problems raise
    :class:`YamlError` naming ``field``."""
    raw = text.encode() if isinstance(text, str) else text
    if len(raw) > max_bytes:
        raise YamlError({field: f"is {len(raw)} bytes; the limit is {max_bytes} bytes"})
    try:
        return yaml.load(raw.decode("utf-8"), Loader=_StrictSafeLoader)  # noqa: S506 - strict safe loader
    except UnicodeDecodeError:
        raise YamlError({field: "is not UTF-8 text"}) from None
    except (ValueError, OverflowError, RecursionError) as exc:
        # PyYAML's constructors let these through, e.g. an integer past Python's 4300-digit limit.
        raise YamlError({field: f"is not valid YAML: {str(exc)[:200]}"}) from None
    except yaml.YAMLError as exc:
        where = ""
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        if mark is not None:
            where = f" (line {mark.line + 1}, column {mark.column + 1})"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise YamlError({field: f"is not valid YAML{where}: {problem}"}) from None
