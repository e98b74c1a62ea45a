"""The unique index of ``@task(unique=…)`` on MariaDB databases that ran 0002 before it
was a ``UniqueJobConstraint`` (Django created nothing there); nothing elsewhere."""

from typing import Any

from django.db import migrations

from django_dbworker.control.unique import add_missing_unique_indexes


def add_the_unique_index(apps: Any, schema_editor: Any) -> None:
    add_missing_unique_indexes(apps.get_model("dbworker_tasks", "TaskJob"), schema_editor)


class Migration(migrations.Migration):
    dependencies = [
        ("dbworker_tasks", "0009_state_index"),
    ]

    operations = [
        # DDL: MariaDB cannot run it inside a transaction.
        migrations.RunPython(add_the_unique_index, migrations.RunPython.noop, atomic=False),
    ]
