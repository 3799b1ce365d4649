"""The submit's active-job count is one prepared statement per connection, whoever asks.

``active_jobs_count`` binds plain Python ints on the server; psycopg types a plain int by its
size (int2 below 32768, int4, int8) and keys its prepared statements by (SQL, parameter types),
so the same SQL becomes another statement per size of the user's id (and of the cap), each
counted, parsed and planned anew ``prepare_threshold`` times. apps/core/prepared.py wraps the
ORM's values in the ORM's own type (``kinds``) for exactly this reason; this statement is sent
by hand, so it wraps them itself (review27).
"""

from __future__ import annotations

import pytest

from apps.jobs.services import active_jobs_count


def prepared_statements() -> list[str]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [statement for (statement,) in cursor.fetchall()]


@pytest.mark.django_db
def test_the_active_count_is_one_prepared_statement_whatever_the_user_id():
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("prepared statements are PostgreSQL's")
    threshold = connection.settings_dict["OPTIONS"]["prepare_threshold"]
    for user_id in (7, 40_000, 3_000_000_000):  # int2, int4, int8 to psycopg
        for _ in range(threshold + 1):
            assert active_jobs_count(user_id, limit=100) == 0
    counts = [s for s in prepared_statements() if "SELECT COUNT(*) FROM (SELECT 1 FROM" in s]
    assert len(counts) == 1, f"{len(counts)} prepared statements of one SQL text: {counts}"

