"""A version trained here keeps its class names in ``lineage["class_names"]`` (new-user trial 16,
G17): a val's class check read them from the training dataset's row, and deleting that dataset
switched the check off. Existing versions get them from that dataset where it still exists, else
from their weights file's model (the checkpoint scan, which loads nothing) where it is on this
machine; the rest stay unknown, and a val of them is refused (apps/jobs/inputs.py)."""

from django.db import migrations


def class_names_backfill(apps, schema_editor=None) -> int:
    """Record the class names of trained versions that have none; returns how many it recorded."""
    from apps.core.artifacts import ArtifactKeyError, artifact_path
    from apps.registry.checkpoint_scan import CheckpointRefused, scan_checkpoint
    from apps.registry.models import trained_class_names

    ModelVersion = apps.get_model("registry", "ModelVersion")
    recorded = 0
    for version in ModelVersion.objects.filter(source="training").select_related("dataset").iterator():
        lineage = dict(version.lineage or {})
        if lineage.get("class_names"):
            continue
        names = trained_class_names(lineage, version.dataset) if version.dataset_id else None
        if not names and version.weights_key:
            try:
                names = scan_checkpoint(artifact_path(version.weights_key)).class_names
            except (ArtifactKeyError, CheckpointRefused, OSError, ValueError):
                names = None
        if names:
            lineage["class_names"] = names
            ModelVersion.objects.filter(pk=version.pk).update(lineage=lineage)
            recorded += 1
    return recorded


class Migration(migrations.Migration):

    dependencies = [
        ('registry', '0004_results_of_weights_without_version'),
    ]

    operations = [
        migrations.RunPython(class_names_backfill, migrations.RunPython.noop),
    ]
