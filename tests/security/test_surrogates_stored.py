"""Rows stored with a lone UTF-16 surrogate before the parsers refused them (new-user trial 27, F12):
the data migrations (datasets 0004, jobs 0025, registry 0006, sweeps 0002) rewrite each as its
escape's text, and the HTML pages that printed them (the portal's dataset and job pages, the
dataset's admin change page) answer 200 again instead of a 500.

Only SQLite holds such rows (PostgreSQL's jsonb refuses ``\\ud800``): there the migrations do nothing.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from django.apps import apps as current_apps
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from apps.core.stored_surrogates import lone_surrogates_escape, surrogates_escaped
from apps.datasets.models import Dataset
from apps.jobs.models import Job
from tests.conftest import admin_client
from tests.jobs.factories import make_job

BEFORE = [
    ("datasets", "0003_classify_kind"),
    ("jobs", "0024_executorattempt_scancel_sent"),
    ("registry", "0005_trained_versions_keep_class_names"),
    ("sweeps", "0001_initial"),
]
EMOJI = "\U0001f600"  # json.dumps writes it as the escaped pair "\ud83d\ude00"


def migrate(targets) -> None:
    MigrationExecutor(connection).migrate(targets)


def latest() -> list:
    executor = MigrationExecutor(connection)
    return [key for key in executor.loader.graph.leaf_nodes() if key[0] in {app for app, _ in BEFORE}]


def sqlite_only() -> None:
    if connection.vendor != "sqlite":
        pytest.skip("only SQLite ever stored a lone surrogate (PostgreSQL's jsonb refuses \\ud800)")


@pytest.mark.django_db(transaction=True)
def test_the_migrations_rewrite_lone_surrogates_and_the_pages_answer_again(bob, superuser, teams):
    """Failed before the migrations: the three pages raised UnicodeEncodeError (a 500)."""
    sqlite_only()
    dataset = Dataset.objects.create(
        team=teams["vision"],
        name="before",
        key="datasets/vision/before/v1",
        names=["ok", "\ud800", f"smile {EMOJI}"],
        num_classes=3,
    )
    job = make_job(team=teams["vision"], user=bob)
    Job.objects.filter(pk=job.pk).update(spec={**job.spec, "description": f"before \udfff and {EMOJI}"})
    migrate(BEFORE)
    migrate(latest())

    assert Dataset.objects.get(pk=dataset.pk).names == ["ok", "\\ud800", f"smile {EMOJI}"]
    assert Job.objects.get(pk=job.pk).spec["description"] == f"before \\udfff and {EMOJI}"
    page = admin_client(bob).get(f"/datasets/{dataset.pk}/")
    assert page.status_code == 200 and EMOJI in page.content.decode()
    assert admin_client(superuser).get(f"/admin/datasets/dataset/{dataset.pk}/change/").status_code == 200
    assert admin_client(bob).get(f"/jobs/{job.pk}/").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_the_migrations_leave_rows_without_a_lone_surrogate_as_they_were(bob, teams):
    """Run for real on either database (on PostgreSQL they do nothing at all)."""
    names = [f"smile {EMOJI}", "café", "a \\ud800 written out"]
    dataset = Dataset.objects.create(team=teams["vision"], name="kept", key="datasets/vision/kept/v1", names=names)
    job = make_job(team=teams["vision"], user=bob)
    Job.objects.filter(pk=job.pk).update(spec={**job.spec, "description": f"run {EMOJI}"})
    job.refresh_from_db()
    migrate(BEFORE)
    migrate(latest())
    assert Dataset.objects.get(pk=dataset.pk).names == names
    assert Job.objects.get(pk=job.pk).spec == job.spec


def escape_all(editor=None) -> int:
    editor = editor or SimpleNamespace(connection=connection)
    return lone_surrogates_escape(
        current_apps, editor, app_label="datasets", fields={"Dataset": ("names", "stats")}
    ) + lone_surrogates_escape(current_apps, editor, app_label="jobs", fields={"Job": ("spec",)})


@pytest.mark.django_db
def test_rows_without_a_surrogate_escape_are_not_even_read(bob, teams, django_assert_num_queries):
    """One GLOB per table and nothing else where no row's text holds a surrogate's escape (other
    escaped characters, é or 模型, do not match): cheap on a large table. On PostgreSQL, no query."""
    Dataset.objects.create(
        team=teams["vision"], name="plain", key="datasets/vision/plain/v1", names=["café", "模型", "plain"]
    )
    make_job(team=teams["vision"], user=bob)
    with django_assert_num_queries(2 if connection.vendor == "sqlite" else 0):
        assert escape_all() == 0


@pytest.mark.django_db
def test_emoji_and_a_written_backslash_u_are_read_but_left_as_they_were(bob, teams):
    """Their JSON text matches the GLOB (an emoji is the escaped pair \\ud83d\\ude00), decoded they
    hold no lone surrogate: nothing is written."""
    names = [f"smile {EMOJI}", "a \\ud800 written out", "plain"]
    Dataset.objects.create(team=teams["vision"], name="emoji", key="datasets/vision/emoji/v1", names=names)
    assert escape_all() == 0
    assert Dataset.objects.get(name="emoji").names == names


def test_only_lone_surrogates_are_rewritten_in_keys_and_values():
    stored = json.loads('{"\\udc00k": ["\\ud800", "\\ud83d\\ude00\\udbff", 3, null], "pair": "\\ud83d\\ude00"}')
    assert surrogates_escaped(stored) == {"\\udc00k": ["\\ud800", f"{EMOJI}\\udbff", 3, None], "pair": EMOJI}
