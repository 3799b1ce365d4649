"""Indexes on the big tables are built without blocking writes (docs/deploy.md, "Upgrades").

The docs promise that `manage.py migrate` is safe while the old web, scheduler and workers
run because indexes on the big tables are built CONCURRENTLY on PostgreSQL
(apps/core/migration_ops.py). Operator trial 29 found three migrations (jobs 0017, 0019,
0022) written by `makemigrations` with Django's plain AddIndex/RemoveIndex: a plain
CREATE INDEX on jobs_job / jobs_jobevent, which stops every submit, event and state write
for as long as the build takes on a large installation.
"""

from __future__ import annotations

from django.db import migrations
from django.db.migrations.loader import MigrationLoader

from apps.core.migration_ops import AddIndexOnline, RemoveIndexOnline

# The tables that grow with jobs × epochs (docs/deploy.md, "Sizing"), by (app, model).
BIG = {
    ("jobs", "job"),
    ("jobs", "jobevent"),
    ("jobs", "metricpoint"),
    ("jobs", "logchunk"),
    ("jobs", "checkpoint"),
    ("quotas", "usagerecord"),
}


def test_every_index_added_or_removed_on_a_big_table_after_its_creation_is_online():
    loader = MigrationLoader(None, ignore_no_migrations=True)
    plain = []
    for (app, name), migration in sorted(loader.disk_migrations.items()):
        if migration.initial:
            continue  # the table is created empty in the same migration
        for op in migration.operations:
            if not isinstance(op, (migrations.AddIndex, migrations.RemoveIndex)):
                continue
            if (app, op.model_name.lower()) not in BIG:
                continue
            online = isinstance(op, (AddIndexOnline, RemoveIndexOnline))
            if not online or migration.atomic:
                plain.append(
                    f"{app}.{name}: {type(op).__name__} on {op.model_name}"
                    + ("" if online else " (use apps.core.migration_ops)")
                    + (" in an atomic migration (atomic = False)" if migration.atomic else "")
                )
    assert plain == []


# Written before this rule, applied on every installation since (a change now would not reach them):
# each built its index the plain way, on a table still small at the time.
BEFORE_THE_RULE = {
    ("jobs", "0002_checkpoint_unique"),
    ("jobs", "0003_run_class_and_runtime_signature"),
    ("quotas", "0005_usage_outlives_its_job"),
}


def builds_an_index(op) -> str:
    """What in ``op`` builds an index on its table the plain way, or "": a field with ``db_index``
    (a ForeignKey has one unless it says ``db_index=False``) or ``unique``, a unique constraint,
    raw SQL that creates an index without CONCURRENTLY."""
    if isinstance(op, (migrations.AddField, migrations.AlterField)) and (op.field.db_index or op.field.unique):
        return f"{type(op).__name__} {op.name} (db_index/unique: add the field without it, then AddIndexOnline)"
    if isinstance(op, migrations.AddConstraint):
        return f"AddConstraint {op.constraint.name} (a unique index: build it CONCURRENTLY first, RunSQL)"
    if isinstance(op, migrations.RunSQL):
        sql = " ".join(str(s) for s in (op.sql if isinstance(op.sql, (list, tuple)) else [op.sql])).upper()
        if "INDEX" in sql and "CREATE" in sql and "CONCURRENTLY" not in sql:
            return "RunSQL CREATE INDEX without CONCURRENTLY"
    return ""


def test_no_other_operation_builds_a_plain_index_on_a_big_table():
    """Not only AddIndex: a new ``db_index=True`` field, a ForeignKey, ``unique=True``, a unique
    constraint or raw SQL on a big table builds a blocking index too (review29)."""
    loader = MigrationLoader(None, ignore_no_migrations=True)
    plain = []
    for (app, name), migration in sorted(loader.disk_migrations.items()):
        if migration.initial or (app, name) in BEFORE_THE_RULE:
            continue
        for op in migration.operations:
            model = getattr(op, "model_name", None)
            on_big = model and (app, model.lower()) in BIG
            if on_big or (isinstance(op, migrations.RunSQL) and any(f"{a}_{m}" in str(op.sql).lower() for a, m in BIG)):
                if what := builds_an_index(op):
                    plain.append(f"{app}.{name}: {what}")
    assert plain == []


def test_the_check_finds_each_kind_of_plain_index():
    """The check above can fail: each kind of operation it looks for, as makemigrations writes it."""
    from django.db import models

    found = [
        builds_an_index(migrations.AddField("job", "tag", models.CharField(max_length=9, db_index=True))),
        builds_an_index(migrations.AddField("job", "owner", models.ForeignKey("auth.User", models.CASCADE))),
        builds_an_index(migrations.AlterField("job", "tag", models.CharField(max_length=9, unique=True))),
        builds_an_index(migrations.AddConstraint("job", models.UniqueConstraint(fields=["tag"], name="u"))),
        builds_an_index(migrations.RunSQL("CREATE INDEX x ON jobs_job (tag)")),
    ]
    assert all(found), found
    assert not builds_an_index(migrations.AddField("job", "tag", models.CharField(max_length=9)))
    assert not builds_an_index(migrations.RunSQL("CREATE INDEX CONCURRENTLY x ON jobs_job (tag)"))
