# The registry's VersionCounter moves here (state only: the table keeps its name), so that
# datasets can issue never-reused version numbers too without importing the registry.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('accounts', '0002_audit_entry'),
        ('registry', '0002_version_counter'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='VersionCounter',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('kind', models.CharField(max_length=20)),
                        ('name', models.CharField(max_length=200)),
                        ('last', models.PositiveIntegerField(default=0)),
                        ('team', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='accounts.team')),
                    ],
                    options={
                        'db_table': 'registry_versioncounter',
                        'constraints': [models.UniqueConstraint(fields=('kind', 'team', 'name'), name='one_version_counter')],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
