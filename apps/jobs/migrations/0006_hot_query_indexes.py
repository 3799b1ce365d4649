# Indexes for the hot reads (tests/jobs/test_indexes.py). Built CONCURRENTLY on PostgreSQL,
# so a running installation keeps accepting jobs while they build.

from django.db import migrations, models

from apps.core.migration_ops import AddIndexOnline, RemoveIndexOnline


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("jobs", "0005_priority_score"),
    ]

    operations = [
        AddIndexOnline(
            model_name="job",
            index=models.Index(fields=["team", "state", "-created_at"], name="job_team_state_recent"),
        ),
        RemoveIndexOnline(model_name="job", name="jobs_job_team_id_3a8b75_idx"),
        AddIndexOnline(
            model_name="job",
            index=models.Index(fields=["team", "-created_at"], name="job_team_recent"),
        ),
        AddIndexOnline(
            model_name="job",
            index=models.Index(fields=["user", "-created_at"], name="job_user_recent"),
        ),
        AddIndexOnline(
            model_name="job",
            index=models.Index(
                condition=models.Q(("state", "queued")), fields=["team", "queue_position", "created_at"],
                name="job_queue_order",
            ),
        ),
        AddIndexOnline(
            model_name="metricpoint",
            index=models.Index(fields=["job", "seq"], name="metric_job_seq"),
        ),
    ]
