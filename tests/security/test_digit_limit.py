"""A number given as thousands of digits (review32): Python's int() refuses a string past 4300
digits with a ValueError, after the ASCII-digits checks these parameters passed: a 500."""

from __future__ import annotations

import pytest

from tests.conftest import admin_client, api_client

pytestmark = pytest.mark.django_db

DIGITS = "9" * 5000


def test_an_audit_after_of_thousands_of_digits_is_a_400_naming_it(alice):
    response = api_client(alice).get("/api/v1/audit/", {"after": DIGITS})
    assert response.status_code == 400 and list(response.json()) == ["after"], response.content


def test_an_admin_team_filter_of_thousands_of_digits_shows_nothing_and_says_so(manager):
    response = admin_client(manager).get(f"/admin/jobs/job/?team={DIGITS}")
    assert response.status_code == 200
    assert response.context["cl"].result_count == 0
    assert [str(m) for m in response.context["messages"]] == [
        f"team={DIGITS[:40]!r} is not a team's id: nothing is shown; choose the team in the filter"
    ]
