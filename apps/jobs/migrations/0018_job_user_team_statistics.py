"""PostgreSQL: extended statistics on (user_id, team_id) of jobs (nothing on SQLite).

A user's jobs are (nearly) all in their one team, but the planner multiplies the two
columns' selectivities as if independent: for ``GET jobs/?mine=1`` (team = ? AND user = ?,
newest first, one page) it expected a few hundred rows where there were thousands, read
them all and sorted them for one page of 100 (66.9 ms p95 at 100k jobs, docs/performance.md).
With the dependency known it walks an index in order and stops after the page
(tests/jobs/test_indexes.py). Used once ANALYZE (autovacuum's) has run; costs nothing per write.
"""

from django.db import migrations

CREATE = "CREATE STATISTICS IF NOT EXISTS job_user_team_stats (dependencies, ndistinct) ON user_id, team_id FROM jobs_job"
DROP = "DROP STATISTICS IF EXISTS job_user_team_stats"


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("jobs", "0017_job_user_state_team")]
    operations = [migrations.RunPython(forwards, backwards)]
