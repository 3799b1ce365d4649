"""An integer too long to write out is refused by the YAML loader, naming its path (review27).

A YAML hex integer (``0xfff…``) loads past Python's 4300-digit limit for ``str()``: every message that
quoted it failed to format, a 500 — a spec's ``task_name`` or ``export`` list, data.yaml's ``names``,
``nc`` and ``kpt_shape``, and since the parser no longer caps ``workers`` (3f2947b) "is <workers>; the
limit is 8" too.
"""

from __future__ import annotations

import pytest

from apps.core.strict_yaml import YamlError, load_yaml
from tests.conftest import api_client

HUGE = "0x" + "f" * 4000


@pytest.mark.parametrize(
    ("text", "path"),
    [
        (f"task_name: {HUGE}\n", "task_name"),
        (f"train: {{data: demo, epochs: [1, {HUGE}]}}\n", "train.epochs[1]"),
        (f"- {HUGE}\n", "[0]"),
    ],
)
def test_an_integer_too_long_to_write_out_is_refused_naming_its_path(text, path):
    with pytest.raises(YamlError) as refused:
        load_yaml(text, max_bytes=64 * 1024)
    assert refused.value.errors == {path: "is a number of more than 100 digits; no field takes one"}


def test_a_long_but_writable_integer_still_loads():
    assert load_yaml("seed: " + "9" * 99 + "\n", max_bytes=1024) == {"seed": int("9" * 99)}


@pytest.mark.django_db
@pytest.mark.parametrize("extra", [f"task_name: {HUGE}\n", f"export: [{HUGE}]\n"])
def test_a_spec_holding_one_is_a_400_not_a_500(extra, bob, demo_registered):
    body = 'command: "yolo train data=demo model=yolov8n.yaml epochs=1"\n' + extra
    if "task_name" not in extra:
        body = "task_name: t\n" + body
    response = api_client(bob).post("/api/v1/jobs/", body, content_type="application/yaml")
    assert response.status_code == 400, response.content[:300]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("line", "path"),
    [(f"names: [scratch, {HUGE}]", "names[1]"), (f"nc: {HUGE}", "nc"), (f"kpt_shape: [{HUGE}, 3]", "kpt_shape[0]")],
)
def test_a_data_yaml_holding_one_is_refused_naming_it_not_a_500(line, path, bob, settings, tmp_path):
    """data.yaml's class names, nc and kpt_shape were quoted in their refusals (a 500)."""
    from tests.datasets.archives import make_zip, upload, valid_files

    settings.DATASETS_DIR = tmp_path / "datasets"
    data_yaml = f"train: images/train\nval: images/val\n{line}\n".encode()
    if not line.startswith("names"):
        data_yaml += b"names: [scratch, dent]\n"
    files = valid_files() | {"data.yaml": data_yaml}
    response = api_client(bob).post(
        "/api/v1/datasets/", {"file": upload(make_zip(files)), "name": "x"}, format="multipart"
    )
    assert response.status_code == 400, response.content[:300]
    (problem,) = response.json()["problems"]
    assert problem["path"] == "data.yaml"
    assert problem["problem"] == f"{path}: is a number of more than 100 digits; no field takes one"


@pytest.mark.django_db
@pytest.mark.parametrize("mode", ["train", "val"])
def test_workers_too_long_to_write_out_is_a_400_naming_it(mode, bob, demo_registered):
    body = f"task_name: t\n{mode}: {{data: demo, model: yolov8n.yaml, workers: {HUGE}}}\nresources: {{gpu: 1}}\n"
    response = api_client(bob).post("/api/v1/jobs/", body, content_type="application/yaml")
    assert response.status_code == 400, response.content[:300]
    assert response.json() == {f"{mode}.workers": ["is a number of more than 100 digits; no field takes one"]}
