# The model lifecycle (issue 10): uploaded weights, lineage, stages, evaluations, exports,
# predictions, shared base weights; artifact keys instead of absolute paths. VersionCounter
# moved to apps.core (state only; the table stays).

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def paths_to_keys(apps, schema_editor):
    from apps.core.artifacts import ArtifactKeyError, artifact_key

    ModelVersion = apps.get_model("registry", "ModelVersion")
    for version in ModelVersion.objects.all():
        try:
            key = artifact_key(version.weights_key)
        except ArtifactKeyError:
            key = ""  # a file outside the data store (never made by the platform): no longer served
        ModelVersion.objects.filter(pk=version.pk).update(weights_key=key)


class Migration(migrations.Migration):

    dependencies = [
        ('core', '0001_version_counter'),
        ('datasets', '0002_versions'),
        ('jobs', '0005_priority_score'),
        ('registry', '0002_version_counter'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name='VersionCounter')],
            database_operations=[],
        ),
        migrations.RenameField(model_name='modelversion', old_name='weights_path', new_name='weights_key'),
        migrations.AddField(
            model_name='modelversion', name='source',
            field=models.CharField(choices=[('training', 'Training'), ('upload', 'Upload')], default='training', max_length=10),
        ),
        migrations.AddField(
            model_name='modelversion', name='filename',
            field=models.CharField(blank=True, help_text="the uploaded file's name (yolov8s.pt)", max_length=200),
        ),
        migrations.AddField(model_name='modelversion', name='task', field=models.CharField(blank=True, max_length=10)),
        migrations.AddField(
            model_name='modelversion', name='parent',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='children', to='registry.modelversion'),
        ),
        migrations.AddField(
            model_name='modelversion', name='dataset',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='model_versions', to='datasets.dataset'),
        ),
        migrations.AddField(model_name='modelversion', name='lineage', field=models.JSONField(blank=True, default=dict)),
        migrations.AddField(
            model_name='modelversion', name='stage',
            field=models.CharField(choices=[('none', 'None'), ('staging', 'Staging'), ('production', 'Production'), ('archived', 'Archived')], default='none', max_length=12),
        ),
        migrations.AddField(model_name='modelversion', name='stage_changed_at', field=models.DateTimeField(blank=True, null=True)),
        migrations.AddField(
            model_name='modelversion', name='uploaded_by',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL),
        ),
        migrations.AlterField(
            model_name='modelversion', name='job',
            field=models.OneToOneField(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='model_version', to='jobs.job'),
        ),
        migrations.RunPython(paths_to_keys, migrations.RunPython.noop),
        migrations.CreateModel(
            name='SharedWeights',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('filename', models.CharField(max_length=200, unique=True)),
                ('key', models.CharField(max_length=500)),
                ('sha256', models.CharField(max_length=64)),
                ('size', models.BigIntegerField()),
                ('task', models.CharField(blank=True, max_length=10)),
                ('scan', models.JSONField(blank=True, default=dict)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('added_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
            ],
            options={'ordering': ['filename'], 'verbose_name_plural': 'shared weights'},
        ),
        migrations.CreateModel(
            name='Evaluation',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('dataset_lineage', models.JSONField(blank=True, default=dict)),
                ('split', models.CharField(default='val', max_length=10)),
                ('metrics', models.JSONField(blank=True, default=dict)),
                ('per_class', models.JSONField(blank=True, default=list)),
                ('speed', models.JSONField(blank=True, default=dict)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('dataset', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='datasets.dataset')),
                ('job', models.OneToOneField(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='evaluation', to='jobs.job')),
                ('version', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='evaluations', to='registry.modelversion')),
            ],
            options={'ordering': ['-created_at']},
        ),
        migrations.CreateModel(
            name='Export',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('format', models.CharField(max_length=20)),
                ('options', models.JSONField(blank=True, default=dict)),
                ('key', models.CharField(max_length=500)),
                ('sha256', models.CharField(max_length=64)),
                ('size', models.BigIntegerField()),
                ('verification', models.JSONField(blank=True, default=dict)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('job', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='exports', to='jobs.job')),
                ('version', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='exports', to='registry.modelversion')),
            ],
            options={'ordering': ['-created_at']},
        ),
        migrations.CreateModel(
            name='PredictionRun',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('source', models.JSONField(blank=True, default=dict)),
                ('key', models.CharField(help_text='artifact key of the predict/ folder', max_length=500)),
                ('images', models.PositiveIntegerField(default=0)),
                ('boxes', models.PositiveIntegerField(default=0)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('job', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='prediction_run', to='jobs.job')),
                ('version', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='prediction_runs', to='registry.modelversion')),
            ],
            options={'ordering': ['-created_at']},
        ),
    ]
