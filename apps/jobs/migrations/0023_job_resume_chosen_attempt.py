from django.db import migrations, models
from django.db.models import F


def chosen_attempts_fill(apps, schema_editor):
    """What ``resume_chosen_at`` said, as an attempt number: a running attempt that had chosen
    chose itself; otherwise (queued, placed, running and not chosen yet) the attempt before it is
    the one that may still record, as the old fence let it.

    Only the active jobs' rows (a handful): an ended job records nothing, whatever the number, and
    rewriting every job row in migrate's transaction would hold the running workers' writes up
    (review24, 4). ``resume_chosen_at`` is kept (the previous release's workers still write it while
    they run; :func:`apps.jobs.services.attempt_may_record` reads both) and dropped a release later.
    """
    Job = apps.get_model("jobs", "Job")
    active = Job.objects.filter(state__in=("queued", "starting", "running"), attempt__gte=1)
    active.update(resume_chosen_attempt=F("attempt") - 1)
    active.filter(state="running", resume_chosen_at__isnull=False).update(resume_chosen_attempt=F("attempt"))


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0022_jobevent_kind_recent'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='resume_chosen_attempt',
            field=models.PositiveIntegerField(db_default=0, default=0),
        ),
        migrations.RunPython(chosen_attempts_fill, migrations.RunPython.noop),
    ]
