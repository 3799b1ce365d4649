"""Lone UTF-16 surrogates stored before the parsers refused them (new-user trial 27, F1 and F12).

A JSON or YAML ``"\\ud800"`` escape decodes to half a surrogate pair, text UTF-8 cannot write.
Before ``apps.core.api.StrictJSONParser`` and ``apps.core.strict_yaml`` refused them, such text was
stored in JSON columns (a spec's description, a data.yaml's class names) and every HTML page that
printed it was a 500 (the API escapes it since, ``apps.core.api.EscapingJSONRenderer``).

Only SQLite holds such rows: PostgreSQL's jsonb and text refuse a lone surrogate, and Python's
sqlite3 cannot write one into a text column, so they live only inside JSONField values, which
Django writes with ``json.dumps`` (``ensure_ascii``): as ``\\udXXX`` escape text. The data migrations
that call :func:`lone_surrogates_escape` find those rows with one GLOB per table (no row decoded
unless its text holds such an escape) and rewrite each lone surrogate as its escape's visible
text (``\\ud800``, backslash included), as the refusals name it. Pairs (an emoji is written as
``\\ud83d\\ude00`` too) decode to one character and are left as they are.
"""

from __future__ import annotations

import re
from typing import Any

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")

# A \u escape of a UTF-16 surrogate (D800–DFFF) in JSON text: a candidate, decoded to be sure
# (it may be half of a pair, or an escaped backslash followed by "ud8…").
SURROGATE_ESCAPE_GLOB = "*\\u[dD][89abcdefABCDEF]*"


def surrogates_escaped(value: Any) -> Any:
    """``value`` (decoded JSON) with each lone surrogate in its strings and keys written as its
    escape's text (``"\\ud800"`` → ``"\\\\ud800"``); everything else, pairs included, as it was."""
    if isinstance(value, str):
        if _LONE_SURROGATE.search(value):
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
        return value
    if isinstance(value, dict):
        return {surrogates_escaped(key): surrogates_escaped(item) for key, item in value.items()}
    if isinstance(value, list):
        return [surrogates_escaped(item) for item in value]
    return value


def lone_surrogates_escape(apps, schema_editor, *, app_label: str, fields: dict[str, tuple[str, ...]]) -> int:
    """Rewrite the lone surrogates stored in ``fields`` (model name → its JSONFields) of
    ``app_label``'s models; returns how many rows changed. Nothing on a database other than SQLite
    (none holds such text). Each table is read once with one GLOB on the columns' text; only the
    rows it matches are decoded, and only those holding a lone surrogate are written."""
    connection = schema_editor.connection
    if connection.vendor != "sqlite":
        return 0
    quote = connection.ops.quote_name
    changed = 0
    for model_name, names in fields.items():
        model = apps.get_model(app_label, model_name)
        columns = [model._meta.get_field(name).column for name in names]
        where = " OR ".join(f"{quote(column)} GLOB %s" for column in columns)
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT {quote(model._meta.pk.column)} FROM {quote(model._meta.db_table)} WHERE {where}",
                [SURROGATE_ESCAPE_GLOB] * len(columns),
            )
            candidates = [row[0] for row in cursor.fetchall()]
        for start in range(0, len(candidates), 500):  # below SQLite's limit on a statement's variables
            for row in model.objects.filter(pk__in=candidates[start : start + 500]).only("pk", *names):
                rewritten = {name: surrogates_escaped(getattr(row, name)) for name in names}
                rewritten = {name: value for name, value in rewritten.items() if value != getattr(row, name)}
                if rewritten:
                    model.objects.filter(pk=row.pk).update(**rewritten)
                    changed += 1
    return changed
