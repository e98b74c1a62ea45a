"""Tasks that wait for a time (``run_after``, a retry's delay) leave the dequeue indexes
for a waiting index (issue 43): the claims no longer read them. On PostgreSQL the new
indexes are built concurrently, so workers and ``enqueue()`` go on meanwhile; each
dequeue index is built anew under a temporary name, then takes its name back."""

from django.db import migrations, models

from django_dbworker.indexes import (
    AddIndexConcurrently,
    DequeueIndex,
    RemoveIndexConcurrently,
    WaitingIndex,
)

CLAIMABLE = models.Q(("process_after__isnull", True), ("state__in", ["queued", "errored"]))
WAITING = models.Q(("process_after__isnull", False), ("state__in", ["queued", "errored"]))


def replaced(name: str, fields: list[str]) -> list[migrations.operations.base.Operation]:
    return [
        AddIndexConcurrently(
            model_name="taskjob",
            index=DequeueIndex(condition=CLAIMABLE, fields=fields, name=f"{name}2"),
        ),
        RemoveIndexConcurrently(model_name="taskjob", name=name),
        migrations.RenameIndex(model_name="taskjob", new_name=name, old_name=f"{name}2"),
    ]


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY

    dependencies = [
        ("dbworker_tasks", "0012_drop_processing_index"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="taskjob",
            index=WaitingIndex(
                condition=WAITING, fields=["process_after"], name="dbworker_tasks_taskjob_wt"
            ),
        ),
        *replaced("dbworker_tasks_taskjob_dq", ["id"]),
        *replaced(
            "dbworker_task_kind_dq", ["backend", "queue_name", "is_async", "-priority", "id"]
        ),
    ]
