"""Lone UTF-16 surrogates stored before the parsers refused them (trial27 F12) are rewritten as
their escape's text (``\\ud800``): the HTML pages that print them were a 500. SQLite only (no
other database holds one); one GLOB per table finds the rows, none decoded otherwise
(apps.core.stored_surrogates)."""

from django.db import migrations

FIELDS = {"Dataset": ("names", "stats")}


def lone_surrogates_escape(apps, schema_editor) -> int:
    from apps.core.stored_surrogates import lone_surrogates_escape

    return lone_surrogates_escape(apps, schema_editor, app_label="datasets", fields=FIELDS)


class Migration(migrations.Migration):
    dependencies = [
        ("datasets", "0003_classify_kind"),
    ]

    operations = [
        migrations.RunPython(lone_surrogates_escape, migrations.RunPython.noop),
    ]
