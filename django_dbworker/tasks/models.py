"""The table of ``django.tasks`` results: one row per enqueued task, a ``WorkerJob``."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now
from django.utils import timezone

from ..control.unique import unique_job_constraint
from ..models import WorkerJob, dequeue_index


class TaskJob(WorkerJob):
    """A task enqueued through ``django.tasks`` (``task.enqueue()``), and its result.

    The worker's bookkeeping columns are ``WorkerJob``'s; these hold what the
    task framework needs: which task, its arguments, and what it returned or
    raised on each attempt.
    """

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
