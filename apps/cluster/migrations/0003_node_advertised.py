from django.db import migrations, models


class Migration(migrations.Migration):
    """What a node advertises (cpu_count, memory_mb) may exceed the machine (host_*); features like tensorrt."""

    dependencies = [
        ('cluster', '0002_node_executor_images_limits'),
    ]

    operations = [
        migrations.AddField(model_name='node', name='host_cpu_count', field=models.PositiveIntegerField(default=0)),
        migrations.AddField(model_name='node', name='host_memory_mb', field=models.PositiveIntegerField(default=0)),
        migrations.AddField(
            model_name='node', name='features',
            field=models.JSONField(blank=True, default=list, help_text='what it offers beyond GPUs, e.g. ["tensorrt"]'),
        ),
    ]
