"""The paths the document walks answer (the refusals' field names): the contract of
``apps.core.values.first_found`` and the three walks built on it (lone surrogates, NUL characters,
integers too long to write out)."""

from __future__ import annotations

import pytest

from apps.core.strict_yaml import YamlError, load_yaml
from apps.core.values import first_surrogate
from apps.jobs.spec import SpecError, parse_spec

LONG = "0x" + "f" * 300  # 362 digits: past the 100-digit bound, still writable


@pytest.mark.parametrize(
    ("document", "path"),
    [
        ("\ud800", ""),
        (["ok", "\ud800"], "[1]"),
        ({"a": [{"b": "x"}, {"b": "\udc00"}]}, "a[1].b"),
        ({"a": {"b": {"c": "\ud800"}}}, "a.b.c"),
        ({1: {2: "\ud800"}}, "1.2"),
        ({"\ud800k": 1}, "\\ud800k"),
        ({"a": {"b\udfff": 1}}, "a.b\\udfff"),
        ({"": {"a": "\ud800"}}, "a"),
    ],
)
def test_a_lone_surrogate_is_named_by_its_path_and_a_key_by_its_own_escaped_path(document, path):
    found = first_surrogate(document)
    assert found is not None and found[0] == path


def test_a_document_without_a_lone_surrogate_has_none():
    assert first_surrogate({"a": ["b", 1, None, {"c": "\U0001f600"}], 2: 3.0}) is None


def test_the_surrogate_answer_names_the_code_point():
    assert first_surrogate({"a": "x\udc01"})[1].startswith("holds a lone UTF-16 surrogate (U+DC01)")


@pytest.mark.parametrize(
    ("document", "path"),
    [
        ({"task_name": "t", "a\x00": 1}, "spec"),
        ({"task_name": "t", "resources": {"gpu\x00": 1}}, "resources"),
        ({"task_name": "t", "sweep": [{"x": 1}, {"k\x00": 1}]}, "sweep[1]"),
    ],
)
def test_a_key_holding_a_nul_is_named_by_the_mapping_that_holds_it(document, path):
    with pytest.raises(SpecError) as refused:
        parse_spec(document)
    assert refused.value.errors == {path: "must not contain a NUL character"}


@pytest.mark.parametrize(
    ("text", "path"),
    [
        (f"{LONG}: 1\n", "spec"),
        (f"train: {{data: demo, {LONG}: 1}}\n", "train"),
        (f"train: [{{a: 1}}, {{{LONG}: 1}}]\n", "train[1]"),
        (f"{{1: {{2: {LONG}}}}}\n", "1.2"),
    ],
)
def test_a_long_number_key_is_named_by_the_mapping_that_holds_it(text, path):
    with pytest.raises(YamlError) as refused:
        load_yaml(text, max_bytes=64 * 1024)
    assert refused.value.errors == {path: "is a number of more than 100 digits; no field takes one"}
