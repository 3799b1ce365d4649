from django.db import migrations, models


class Migration(migrations.Migration):
    """Job.priority holds the planner's score, not a class: call it priority_score (the API keeps 'priority')."""

    dependencies = [
        ('jobs', '0004_job_log_bytes'),
    ]

    operations = [
        migrations.RenameField(model_name='job', old_name='priority', new_name='priority_score'),
        migrations.AlterField(
            model_name='job',
            name='priority_score',
            field=models.FloatField(default=0.0, verbose_name='priority'),
        ),
    ]
