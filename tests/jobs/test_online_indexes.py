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
