from django.db import migrations


class Migration(migrations.Migration):
    # Apart from 0023: PostgreSQL may refuse to alter a table whose rows the same transaction updated.

    dependencies = [
        ('jobs', '0023_job_resume_chosen_attempt'),
    ]

    operations = [
        migrations.RemoveField(
            model_name='job',
            name='resume_chosen_at',
        ),
    ]
