from django.db import migrations, models
from django.db.models import F


def chosen_attempts_fill(apps, schema_editor):
    """What ``resume_chosen_at`` said, as an attempt number: a running attempt that had chosen
    chose itself; otherwise (queued, placed, running and not chosen yet) the attempt before it is
    the one that may still record, as the old fence let it."""
    Job = apps.get_model("jobs", "Job")
    Job.objects.filter(attempt__gte=1).update(resume_chosen_attempt=F("attempt") - 1)
    Job.objects.filter(state="running", resume_chosen_at__isnull=False).update(resume_chosen_attempt=F("attempt"))


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0022_jobevent_kind_recent'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='resume_chosen_attempt',
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.RunPython(chosen_attempts_fill, migrations.RunPython.noop),
    ]
