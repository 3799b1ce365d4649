# Datasets become (team, name, version) with artifact keys instead of absolute paths (issue 10).

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def paths_to_keys(apps, schema_editor):
    """yaml_key held the absolute path of data.yaml: make it a key, and key its folder."""
    from pathlib import Path

    from apps.core.artifacts import ArtifactKeyError, artifact_key

    Dataset = apps.get_model("datasets", "Dataset")
    for dataset in Dataset.objects.all():
        try:
            yaml_key = artifact_key(dataset.yaml_key)
            folder_key = artifact_key(Path(dataset.yaml_key).parent)
        except ArtifactKeyError as exc:
            raise RuntimeError(
                f"dataset {dataset.pk} ({dataset.name}) lives at {dataset.yaml_key}, outside the data store: move it "
                f"under DATASETS_DIR ({settings.DATASETS_DIR}) and point yaml_path there, then migrate again ({exc})"
            ) from None
        Dataset.objects.filter(pk=dataset.pk).update(yaml_key=yaml_key, key=folder_key)


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0003_storage_quota'),
        ('datasets', '0001_initial'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RemoveConstraint(model_name='dataset', name='one_dataset_name_per_team'),
        migrations.RenameField(model_name='dataset', old_name='yaml_path', new_name='yaml_key'),
        migrations.AlterField(
            model_name='dataset', name='yaml_key',
            field=models.CharField(blank=True, help_text="artifact key of data.yaml ('' for images)", max_length=500),
        ),
        migrations.AddField(model_name='dataset', name='version', field=models.PositiveIntegerField(default=1)),
        migrations.AddField(
            model_name='dataset', name='kind',
            field=models.CharField(choices=[('yolo', 'YOLO dataset (images and labels)'), ('images', 'images to predict on')], default='yolo', max_length=10),
        ),
        migrations.AddField(
            model_name='dataset', name='key',
            field=models.CharField(default='', help_text="artifact key of the dataset's folder", max_length=500),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name='dataset', name='sha256',
            field=models.CharField(blank=True, help_text='hash of the file manifest', max_length=64),
        ),
        migrations.AddField(model_name='dataset', name='size_bytes', field=models.BigIntegerField(default=0)),
        migrations.AddField(
            model_name='dataset', name='names',
            field=models.JSONField(blank=True, default=list, help_text='class names by id'),
        ),
        migrations.AddField(model_name='dataset', name='stats', field=models.JSONField(blank=True, default=dict)),
        migrations.AddField(
            model_name='dataset', name='uploaded_by',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL),
        ),
        migrations.AlterModelOptions(name='dataset', options={'ordering': ['team__slug', 'name', '-version']}),
        migrations.AddConstraint(
            model_name='dataset',
            constraint=models.UniqueConstraint(fields=('team', 'name', 'version'), name='one_dataset_version'),
        ),
        migrations.RunPython(paths_to_keys, migrations.RunPython.noop),
    ]
