"""YAML that JSON cannot hold is refused by the loader, naming its path (new-user trial 28).

``priority: !!set {a, b}``, ``!!binary`` or ``!!timestamp`` loaded as Python values (a set, bytes, a
date) that the answers then echoed as reprs (``got {'b', 'a'}``). The standard tags JSON has a type
for (str, int, float, bool, null, seq, map) stay; a date written without a tag is the text written.
"""

from __future__ import annotations

import pytest

from apps.core.strict_yaml import YamlError, load_yaml
from tests.conftest import SEED_SPEC, api_client

NOT_JSON = "; give text, a number, true or false, null, a list or a mapping"


@pytest.mark.parametrize(
    ("text", "path", "tag"),
    [
        ("priority: !!set {a, b}\n", "priority", "!!set"),
        ("description: !!binary aGVsbG8=\n", "description", "!!binary"),
        ("train: {data: demo, epochs: !!timestamp 2026-01-01}\n", "train.epochs", "!!timestamp"),
        ("args: [1, !!omap [{a: 1}]]\n", "args[1]", "!!omap"),
        ("args: !!pairs [{a: 1}]\n", "args", "!!pairs"),
        ("!!set {a}\n", "spec", "!!set"),
        ("? !!binary aGVsbG8=\n: 1\n", "spec", "!!binary"),  # a key: named by the mapping that holds it
    ],
)
def test_a_tag_json_has_no_type_for_is_refused_naming_its_path(text, path, tag):
    with pytest.raises(YamlError) as refused:
        load_yaml(text, max_bytes=1024)
    assert refused.value.errors == {path: f"is tagged {tag}{NOT_JSON}"}


@pytest.mark.parametrize(
    ("text", "loaded"),
    [
        ("when: 2026-01-01\n", {"when": "2026-01-01"}),
        ("when: 2026-01-01 10:00:00\n", {"when": "2026-01-01 10:00:00"}),
        ("2026-01-01: x\n", {"2026-01-01": "x"}),
        (
            "n: !!int '3'\nf: !!float '0.5'\ns: !!str 5\nb: !!bool 'true'\nz: !!null ''\n",
            {"n": 3, "f": 0.5, "s": "5", "b": True, "z": None},
        ),
    ],
)
def test_an_untagged_date_is_its_text_and_json_tags_still_load(text, loaded):
    assert load_yaml(text, max_bytes=1024) == loaded


@pytest.mark.django_db
def test_a_spec_with_a_set_is_a_400_naming_the_field_not_a_python_repr(bob, demo_registered):
    response = api_client(bob).post(
        "/api/v1/jobs/",
        SEED_SPEC.replace("priority: medium", "priority: !!set {a, b}"),
        content_type="application/yaml",
    )
    assert response.status_code == 400, response.content
    assert response.json() == {"priority": [f"is tagged !!set{NOT_JSON}"]}


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("resources:\n  <<: {gpu: 1}\n  cpu: '4'\n", "resources.<<"),
        ("<<: [{task_name: a}, {priority: high}]\n", "<<"),
        ("args: [{<<: {x: 1}}]\n", "args[0].<<"),
        ("resources: {? !!merge m : {gpu: 1}}\n", "resources.m"),
    ],
)
def test_a_merge_key_is_refused_naming_its_path_like_the_aliases_it_would_merge(text, path):
    """Anchors and aliases are refused; ``<<: {gpu: 1}`` (a merge without an alias) was taken (trial28)."""
    with pytest.raises(YamlError) as refused:
        load_yaml(text, max_bytes=1024)
    assert refused.value.errors == {path: "is a YAML merge key (<<); write the keys out in the mapping itself"}


def test_a_quoted_double_less_than_is_an_ordinary_key():
    assert load_yaml("'<<': {gpu: 1}\n", max_bytes=1024) == {"<<": {"gpu": 1}}
