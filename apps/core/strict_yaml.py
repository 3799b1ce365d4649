"""Parsing untrusted YAML: a size cap first, then a safe loader without anchors, aliases, merge keys,
deep nesting, duplicate mapping keys or values JSON has no type for."""

from __future__ import annotations

import codecs
from typing import Any

import yaml

from .errors import FieldErrors
from .values import first_found, first_surrogate


class YamlError(FieldErrors):
    """The text is not acceptable YAML; ``errors`` holds one message under the caller's field name."""


class DuplicateKey(yaml.YAMLError):
    """A mapping names the same key twice; ``path`` is the key's dotted path (``resources.gpu``)."""

    def __init__(self, path: str, first_line: int, second_line: int):
        self.path = path
        lines = f"line {first_line}" if first_line == second_line else f"lines {first_line} and {second_line}"
        self.message = f"given twice in the YAML ({lines})"
        super().__init__(f"{path}: {self.message}")


_STANDARD = "tag:yaml.org,2002:"
# Tags the safe loader builds into Python values JSON has no type for (a set, bytes, a date, lists
# of pairs): they were echoed back as reprs ("got {'b', 'a'}", trial28), or stored as text by luck.
# Tags it knows no constructor for (!!python/…, !local) stay "not valid YAML" from the constructor.
NOT_JSON_TAGS = frozenset(_STANDARD + name for name in ("set", "binary", "timestamp", "omap", "pairs"))


class NotJson(yaml.YAMLError):
    """A node is tagged with a type JSON has not; ``path`` as :class:`DuplicateKey` names it."""

    def __init__(self, path: str, tag: str):
        self.path = path
        short = tag.replace(_STANDARD, "!!", 1) if tag.startswith(_STANDARD) else tag
        self.message = f"is tagged {short}; give text, a number, true or false, null, a list or a mapping"
        super().__init__(f"{path}: {self.message}")


class MergeKey(yaml.YAMLError):
    """A mapping merges another in (``<<:``): refused as the anchors and aliases it exists for are,
    and a merge of an inline mapping too (``<<: {gpu: 1}``), which was taken (trial28)."""

    message = "is a YAML merge key (<<); write the keys out in the mapping itself"

    def __init__(self, path: str):
        self.path = path
        super().__init__(f"{path}: {self.message}")


class _StrictSafeLoader(yaml.SafeLoader):
    """Safe loader that refuses anchors/aliases (billion laughs), merge keys, deep nesting, duplicate
    keys and tags JSON has no type for.

    PyYAML keeps the last of two equal keys without a word, so ``task_name: a`` then
    ``task_name: b`` would silently submit "b"; a spec is a request, so both are refused.
    """

    max_depth = 20
    # A date written without a tag (``description: 2026-01-01``) is the text written, not a
    # datetime.date: the resolver guessed, the author asked for no type.
    yaml_implicit_resolvers = {
        first: [(tag, pattern) for tag, pattern in resolvers if tag != _STANDARD + "timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

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

    def construct_document(self, node):
        self._refuse_duplicate_keys(node, "")
        return super().construct_document(node)

    def _refuse_duplicate_keys(self, node, path: str) -> None:
        """Walk the composed tree before building it: a tag JSON has no type for is refused, and
        keys compare as the values they construct to (``1``/``01``, ``yes``/``true``), the way the
        dict would merge them."""
        if node.tag in NOT_JSON_TAGS:
            raise NotJson(path, node.tag)
        if isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                self._refuse_duplicate_keys(item, f"{path}[{index}]")
        elif isinstance(node, yaml.MappingNode):
            first_lines: dict[Any, int] = {}
            for key_node, value_node in node.value:
                if key_node.tag == _STANDARD + "merge":
                    raise MergeKey(f"{path}.{key_node.value}" if path else key_node.value)
                if not isinstance(key_node, yaml.ScalarNode):
                    self._refuse_duplicate_keys(value_node, path)  # the constructor refuses these itself
                    continue
                if key_node.tag in NOT_JSON_TAGS:  # named by the mapping: the key is no name yet
                    raise NotJson(path, key_node.tag)
                key = self.construct_object(key_node)
                key_path = f"{path}.{key}" if path else str(key)
                line = key_node.start_mark.line + 1
                if key in first_lines:
                    raise DuplicateKey(key_path, first_lines[key], line)
                first_lines[key] = line
                self._refuse_duplicate_keys(value_node, key_path)


def text_decode(raw: bytes, *, field: str = "spec", utf16: bool = False) -> str:
    """Bytes sent as a YAML document → its text: UTF-8 (with or without a BOM); with ``utf16`` also
    UTF-16 that starts with its byte-order mark, what Windows Notepad's "Unicode" and PowerShell 5's
    ``>`` write (trial30: a spec file saved so was answered "is not UTF-8 text"). The mark makes it
    unambiguous; UTF-16 without one is not guessed at. Only specs take it: a data.yaml is read again
    by Ultralytics as UTF-8 where a registered folder keeps its own, so it is told to convert.
    A refusal names the encoding found. YamlError under ``field``."""
    if raw.startswith((codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE)):  # before UTF-16: FF FE starts both
        raise YamlError({field: "is UTF-32 text (it starts with a UTF-32 byte-order mark); save it as UTF-8"})
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        if not utf16:
            raise YamlError({field: "is UTF-16 text (it starts with a UTF-16 byte-order mark); save it as UTF-8"})
        try:
            return raw.decode("utf-16")
        except UnicodeDecodeError as exc:
            raise YamlError({field: f"starts with a UTF-16 byte-order mark but is not UTF-16 text ({exc.reason} at "
                                    f"byte {exc.start}); save it as UTF-8"}) from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise YamlError({field: f"is not UTF-8 text (byte {exc.start} is 0x{raw[exc.start]:02x}); save it as UTF-8"
                                + (" or as UTF-16 with a byte-order mark" if utf16 else "")}) from None


def load_yaml(text: str | bytes, *, max_bytes: int, field: str = "spec", sent_bytes: int | None = None) -> Any:
    """Parse untrusted YAML: size cap first, then the strict safe loader. Problems raise
    :class:`YamlError` naming ``field``.

    The cap is on the UTF-8 text. ``sent_bytes``: the size of the file the text was decoded from
    (a UTF-16 spec's), said beside it where the two differ: a CJK-heavy UTF-16 file under the limit
    is larger as UTF-8, and the refusal quoted that size as if it were the file's (review31)."""
    raw = text.encode() if isinstance(text, str) else text
    if len(raw) > max_bytes:
        if sent_bytes is not None and sent_bytes != len(raw):
            raise YamlError({field: f"is {len(raw)} bytes as UTF-8 (the file sent is {sent_bytes} bytes in its own "
                                    f"encoding); the limit is {max_bytes} bytes of UTF-8"})
        raise YamlError({field: f"is {len(raw)} bytes; the limit is {max_bytes} bytes"})
    decoded = text if isinstance(text, str) else text_decode(raw, field=field)  # a YamlError: not in the try
    try:
        document = yaml.load(decoded, Loader=_StrictSafeLoader)  # noqa: S506 - strict safe loader
    except (DuplicateKey, NotJson, MergeKey) as exc:
        # Named by the key's own path (the spec's field names), so the answer points at the field.
        raise YamlError({exc.path or field: exc.message}) from None
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
    # A "\ud800" escape loads as text UTF-8 cannot write (a spec's description, a class name): named by
    # its path, as a duplicate key is (new-user trial 27, F1).
    if found := first_surrogate(document):
        path, problem = found
        raise YamlError({path or field: problem})
    # A hex integer (0xfff…) loads past Python's 4300-digit limit for str(): every message that quoted
    # it failed to format, a 500 (review27). No field takes a number of that size.
    # A key is named by its mapping's path: one past 4300 digits cannot be written into a path at all.
    if found := first_found(document, _too_long, among=int, key_named="by_its_mapping"):
        path, _ = found
        raise YamlError({path or field: f"is a number of more than {LONG_NUMBER_DIGITS} digits; no field takes one"})
    return document


LONG_NUMBER_DIGITS = 100
_LONG_NUMBER = 10**LONG_NUMBER_DIGITS  # computed once: the walk meets every integer of a spec


def _too_long(number: int) -> bool:
    """More than ``LONG_NUMBER_DIGITS`` digits (a bool is an int too: never)."""
    return not -_LONG_NUMBER < number < _LONG_NUMBER
