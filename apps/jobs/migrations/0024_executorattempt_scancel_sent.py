from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0023_job_resume_chosen_attempt'),
    ]

    operations = [
        migrations.AddField(
            model_name='executorattempt',
            name='scancel_reason',
            field=models.CharField(blank=True, db_default='', max_length=200),
        ),
        migrations.AddField(
            model_name='executorattempt',
            name='scancel_sent_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
