"""Numbers written in other scripts' digits are refused, naming the field: Python's int() and float()
read ``"２"`` (fullwidth), ``"٣"`` (Arabic-Indic) and digits padded with a Unicode space as numbers,
so ``?limit=２`` or a spec's ``epochs: "３"`` were taken as 2 and 3 while every page shows the text."""

from __future__ import annotations

import pytest

from apps.core.values import ascii_float, ascii_int
from apps.jobs.spec import SpecError, parse_spec
from apps.portal.forms import typed
from tests.conftest import api_client

FULLWIDTH_TWO = "\uff12"
ARABIC_THREE = "\u0663"


@pytest.mark.parametrize("text", [FULLWIDTH_TWO, ARABIC_THREE, "1" + ARABIC_THREE, "\u20035"])
def test_the_shared_parsers_refuse_what_only_unicode_makes_a_number(text):
    with pytest.raises(ValueError):
        ascii_int(text)
    with pytest.raises(ValueError):
        ascii_float(text)


def test_the_shared_parsers_read_ascii_as_int_and_float_do():
    assert ascii_int(" -12 ") == -12 and ascii_float("1e-4") == 0.0001


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("query", "field"),
    [(f"limit={FULLWIDTH_TWO}", "limit"), (f"offset={ARABIC_THREE}", "offset")],
)
def test_a_page_asked_for_in_other_digits_is_a_400_naming_the_parameter(query, field, alice):
    response = api_client(alice).get(f"/api/v1/jobs/?{query}")
    assert response.status_code == 400, response.content
    assert list(response.json()) == [field]


@pytest.mark.django_db
def test_a_metrics_cursor_in_other_digits_is_a_400_naming_it(bob, teams):
    from tests.jobs.factories import make_job

    job = make_job(team=teams["vision"], user=bob)
    response = api_client(bob).get(f"/api/v1/jobs/{job.pk}/metrics/?after={FULLWIDTH_TWO}")
    assert response.json() == {"after": [f"must be an integer, got {FULLWIDTH_TWO!r}"]}


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"train": {"data": "demo", "model": "yolov8n.yaml", "epochs": "\uff13"}}, "train.epochs"),
        ({"train": {"data": "demo", "model": "yolov8n.yaml", "lr0": "0.\uff15"}}, "train.lr0"),
        ({"timeout": ARABIC_THREE + "600"}, "timeout"),
        ({"resources": {"gpu": FULLWIDTH_TWO}}, "resources.gpu"),
        ({"resources": {"gpu": 1, "memory": "\uff11\uff16Gi"}}, "resources.memory"),
        ({"resources": {"gpu": 1, "cpu": FULLWIDTH_TWO}}, "resources.cpu"),
        ({"command": f"yolo train data=demo model=yolov8n.yaml epochs={FULLWIDTH_TWO}"}, "command.epochs"),
    ],
)
def test_a_spec_number_in_other_digits_is_refused_at_its_field(changes, field):
    document = {"task_name": "t", "command": "yolo train data=demo model=yolov8n.yaml"} | changes
    if "train" in changes:
        document.pop("command")
    with pytest.raises(SpecError) as refused:
        parse_spec(document)
    assert field in refused.value.errors, refused.value.errors


@pytest.mark.django_db
def test_a_form_field_in_other_digits_is_a_400_naming_it(bob):
    response = api_client(bob).patch(
        "/api/v1/notifications/preferences/", {"quota_percent": "\uff15\uff10"}, format="json"
    )
    assert response.status_code == 400, response.content
    assert list(response.json()) == ["quota_percent"]


def test_the_submit_form_keeps_other_digits_as_text_for_the_parser_to_name():
    assert typed(FULLWIDTH_TWO) == FULLWIDTH_TWO
    assert typed("2") == 2 and typed("0.5") == 0.5


@pytest.mark.django_db
def test_the_portal_token_lifetime_in_other_digits_is_refused_at_its_field(alice):
    """The token page read ``ttl_days`` with int(): "３０" made a 30-day token (review28)."""
    from django.test import Client

    from apps.accounts.models import ApiToken

    client = Client()
    client.force_login(alice)
    html = client.post("/tokens/", {"name": "x", "ttl_days": "\uff13\uff10"}).content.decode()
    assert "must be a whole number of days" in html
    assert not ApiToken.objects.exists()


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"train": {"data": "demo", "model": "yolov8n.yaml", "epochs": "\u20035"}}, "train.epochs"),
        ({"train": {"data": "demo", "model": "yolov8n.yaml", "epochs": "5\u00a0"}}, "train.epochs"),
        ({"resources": {"gpu": 1, "cpu": "\u20034"}}, "resources.cpu"),
    ],
    ids=["em-space", "no-break-space", "cpu"],
)
def test_a_spec_number_padded_with_a_unicode_space_is_refused(changes, field):
    """str.strip() took the Unicode space off for the ASCII check, and int() read it (review28)."""
    document = {"task_name": "t", "command": "yolo train data=demo model=yolov8n.yaml"} | changes
    if "train" in changes:
        document.pop("command")
    with pytest.raises(SpecError) as refused:
        parse_spec(document)
    assert field in refused.value.errors, refused.value.errors


@pytest.mark.parametrize(("text", "taken"), [("3", 3), (" 3 ", 3), ("+3", 3), ("+03", 3), ("3\u3000", None),
                                             ("\u00a03", None), (FULLWIDTH_TWO, None), ("1_0", None), ("3.0", None),
                                             ("0x3", None), ("", None)])
def test_a_spec_integer_given_as_text_is_ascii_digits_with_ascii_spaces_only(text, taken):
    """The spec parser's integers, as text (YAML ``epochs: "3"``): what int() alone would read too
    (a Unicode space, another script's digits, ``1_0``) is refused, naming what was given."""
    document = {"task_name": "t", "train": {"data": "demo", "model": "yolov8n.yaml", "epochs": text}}
    if taken is not None:
        assert parse_spec(document).train_args["epochs"] == taken
        return
    with pytest.raises(SpecError) as refused:
        parse_spec(document)
    assert refused.value.errors["train.epochs"] == f"must be an integer, got {text!r}"


def test_a_spec_integer_given_as_text_past_python_s_digit_limit_is_refused_in_our_words():
    """``epochs: "111…"`` (5,000 digits, quoted): the refusal was Python's own "Exceeds the limit (4300
    digits) for integer string conversion … use sys.set_int_max_str_digits()", advice meant for a
    programmer; now the field's usual words, without the 5,000 digits written back."""
    document = {"task_name": "t", "train": {"data": "demo", "model": "yolov8n.yaml", "epochs": "1" * 5000}}
    with pytest.raises(SpecError) as refused:
        parse_spec(document)
    assert refused.value.errors["train.epochs"] == "must be an integer, got a number of more than 100 digits"
