import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0002_audit_entry'),
    ]

    operations = [
        migrations.AddField(
            model_name='team',
            name='storage_quota_gb',
            field=models.FloatField(blank=True, help_text='uploaded datasets and weights; empty = the site default', null=True),
        ),
        migrations.CreateModel(
            name='StorageCharge',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('key', models.CharField(max_length=500, unique=True)),
                ('bytes', models.BigIntegerField()),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('team', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='storage_charges', to='accounts.team')),
            ],
            options={
                'ordering': ['team__slug', 'key'],
            },
        ),
    ]
