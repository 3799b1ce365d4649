from django.conf import settings
from django.db import migrations, models

from apps.core.migration_ops import AddIndexOnline, RemoveIndexOnline


class Migration(migrations.Migration):
    """Submit's count of a user's active jobs through (user, state), which SQLite uses; it could
    not use the partial index on the active states and walked every job the user ever had."""

    atomic = False  # CONCURRENTLY on PostgreSQL

    dependencies = [
        ('jobs', '0013_checkpoint_key'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        AddIndexOnline(
            model_name='job',
            index=models.Index(fields=['user', 'state'], name='job_user_state'),
        ),
        RemoveIndexOnline(
            model_name='job',
            name='job_user_active',
        ),
    ]
