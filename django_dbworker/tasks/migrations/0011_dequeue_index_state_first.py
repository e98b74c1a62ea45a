"""The tasks' dequeue index with the state first on MariaDB (no partial indexes there:
0005 created it over every row, so claims walked it past every finished task);
nothing elsewhere."""

from typing import Any

from django.db import migrations

from django_dbworker.indexes import add_state_to_dequeue_indexes


def state_first(apps: Any, schema_editor: Any) -> None:
    add_state_to_dequeue_indexes(apps.get_model("dbworker_tasks", "TaskJob"), schema_editor)


class Migration(migrations.Migration):
    dependencies = [
        ("dbworker_tasks", "0010_unique_index_on_mariadb"),
    ]

    operations = [
        # DDL: MariaDB cannot run it inside a transaction.
        migrations.RunPython(state_first, migrations.RunPython.noop, atomic=False),
    ]
