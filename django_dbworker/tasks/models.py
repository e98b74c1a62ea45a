"""The table of ``django.tasks`` results: one row per enqueued task, a ``WorkerJob``."""

from __future__ import annotations

import uuid
from typing import Any

from django.db import models
from django.db.models.functions import Now
from django.utils import timezone

from ..control.unique import unique_job_constraint
from ..models import WorkerJob, dequeue_index


class RandomUUID(models.Func):
    """A random (version 4) UUID made by the database: the default of rows inserted by
    code that does not name the column (workers of an older release during a rolling
    deploy, plain SQL) and of the rows that existed when the column was added."""

    output_field = models.UUIDField()
    template = "gen_random_uuid()"  # PostgreSQL >= 13
    # SQLite: 32 hex digits (how Django stores a UUIDField there), version 4, variant
    # 1. A column default may hold no subquery, hence a blob for each part.
    sqlite_template = (
        "(lower(hex(randomblob(6))) || '4' || substr(lower(hex(randomblob(2))), 2) "
        "|| substr('89ab', 1 + (random() & 3), 1) || substr(lower(hex(randomblob(8))), 2))"
    )

    mysql_template = (
        "(LOWER(CONCAT(HEX(RANDOM_BYTES(6)), '4', SUBSTR(HEX(RANDOM_BYTES(2)), 2), "
        "SUBSTR('89ab', 1 + FLOOR(RAND() * 4), 1), SUBSTR(HEX(RANDOM_BYTES(8)), 2))))"
    )

    def as_sqlite(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        return self.as_sql(compiler, connection, template=self.sqlite_template, **extra_context)

    def as_mysql(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        # 32 hex digits, version 4, variant 1 (a uuid column takes them as they are);
        # RANDOM_BYTES() is MariaDB >= 10.10 (before: UUID(), version 1, unique all the
        # same).
        if connection.mysql_is_mariadb and connection.mysql_version < (10, 10):
            template = "(REPLACE(UUID(), '-', ''))"
        else:
            template = self.mysql_template
        return self.as_sql(compiler, connection, template=template, **extra_context)


class TaskJob(WorkerJob):
    """A task enqueued through ``django.tasks`` (``task.enqueue()``), and its result.

    The worker's bookkeeping columns are ``WorkerJob``'s; these hold what the
    task framework needs: which task, its arguments, and what it returned or
    raised on each attempt.
    """

    #: ``TaskResult.id``: random, so a result cannot be found by guessing its id
    #: (the primary key, a sequence, stays the engine's key).
    result_id = models.UUIDField(
        default=uuid.uuid4, db_default=RandomUUID(), unique=True, editable=False
    )
    task_path = models.CharField(max_length=255, help_text="Dotted path of the task.")
    backend = models.CharField(max_length=100, default="default", db_default="default")
    queue_name = models.CharField(max_length=100, default="default", db_default="default")
    priority = models.IntegerField(default=0, db_default=0)
    run_after = models.DateTimeField(
        null=True, blank=True, help_text="The earliest time the task was to run."
    )
    args = models.JSONField(default=list, db_default=models.Value("[]"), blank=True)
    kwargs = models.JSONField(default=dict, db_default=models.Value("{}"), blank=True)
    enqueued_at = models.DateTimeField(default=timezone.now, db_default=Now())
    #: What the task returned (JSON), once it succeeded.
    return_value = models.JSONField(null=True, blank=True)
    #: One entry per attempt that raised: exception class path and traceback.
    errors = models.JSONField(default=list, db_default=models.Value("[]"), blank=True)
    #: When its first attempt started (``TaskResult.started_at``); ``started_at`` is
    #: the latest attempt's (``last_attempted_at``).
    first_started_at = models.DateTimeField(null=True, blank=True)
    #: The engine options it was enqueued with (``@task(...)``, ``using(...)``), in
    #: seconds: ``{"max_retries": 3, "retry_after": 30.0}``. NULL: none (the backend's).
    options = models.JSONField(null=True, blank=True)
    #: The worker of each attempt, in order (``TaskResult.worker_ids``).
    worker_ids = models.JSONField(default=list, db_default=models.Value("[]"), blank=True)
    #: The task function is ``async def``: a worker runs it on its event loop.
    is_async = models.BooleanField(default=False, db_default=False)
    #: ``@task(unique=...)``: the task path and key while a run holds it (see backend).
    unique_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001 - NULL: not unique

    class Meta(WorkerJob.Meta):
        verbose_name = "task"
        indexes = [
            *WorkerJob.Meta.indexes,
            # What claims scan: a backend's queues in priority order, sync and async
            # tasks apart (each has its own claims: a backlog of one never slows the
            # other's).
            dequeue_index(
                "backend",
                "queue_name",
                "is_async",
                "-priority",
                "id",
                name="dbworker_task_kind_dq",
            ),
        ]
        constraints = [
            *WorkerJob.Meta.constraints,
            unique_job_constraint("backend", "unique_key", name="dbworker_task_unique_active"),
        ]

    def __str__(self) -> str:
        return f"{self.task_path} {self.pk} ({self.state})"
