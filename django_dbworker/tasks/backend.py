"""``DatabaseBackend``: Django's tasks framework on the worker engine.

``TASKS = {"default": {"BACKEND": "django_dbworker.tasks.DatabaseBackend",
"QUEUES": [...], "OPTIONS": {...}}}``. Enqueueing inserts one ``TaskJob`` row
(part of the caller's transaction; workers wake at commit); ``runworker
--tasks`` runs them with every guarantee of the engine.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta
from typing import Any

from django.db import router

from . import compat
from .compat import normalize_json
from .options import TaskOptions

compat.require()
Task = compat.Task
BaseTaskBackend = compat.BaseTaskBackend
InvalidTask = compat.InvalidTask
TaskResultDoesNotExist = compat.TaskResultDoesNotExist


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DatabaseTask(Task):  # type: ignore[misc,valid-type]
    """A task with the engine's per-task options, given to ``@task(...)``:
    ``max_retries`` (errors after the first that are retried; the backend's
    ``MAX_RETRIES`` when None), ``retry_after`` (seconds or a ``timedelta``),
    ``retry_backoff``, ``retry_max_delay``, ``max_runtime``. None: the backend's.
    """

    max_retries: int | None = None
    retry_after: float | timedelta | None = None
    retry_backoff: float | None = None
    retry_max_delay: float | timedelta | None = None
    max_runtime: float | timedelta | None = None


class DatabaseBackend(BaseTaskBackend):  # type: ignore[misc,valid-type]
    task_class = DatabaseTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.engine = TaskOptions.from_settings(alias, self.options)

    # -- enqueueing ------------------------------------------------------------------

    def validate_task(self, task: Any) -> None:
        super().validate_task(task)
        self.engine.validate_task(task)

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        """One INSERT (and NOTIFY on PostgreSQL): part of the caller's transaction."""
        from ..sql.notify import insert_notifying
        from .models import TaskJob
        from .results import result_of

        self.validate_task(task)
        args, kwargs = self._checked_arguments(task, args, kwargs)
        job = TaskJob(
            task_path=task.module_path,
            backend=self.alias,
            queue_name=task.queue_name,
            priority=task.priority,
            run_after=task.run_after,
            process_after=task.run_after,
            args=args,
            kwargs=kwargs,
        )
        using = router.db_for_write(TaskJob)
        insert_notifying(job, using)  # one statement: the INSERT and its NOTIFY
        result = result_of(job, task)
        compat.signals.task_enqueued.send(type(self), task_result=result)
        return result

    def _checked_arguments(
        self, task: Any, args: Any, kwargs: Any
    ) -> tuple[list[Any], dict[str, Any]]:
        """Arguments as they will be stored (JSON), or a clear error now, at enqueue
        time, instead of a worker finding out later."""
        try:
            args, kwargs = normalize_json(list(args)), normalize_json(dict(kwargs))
            json.dumps([args, kwargs])
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"arguments of task {task.module_path} must be JSON-serialisable: {exc}"
            ) from None
        return args, kwargs

    # -- results ---------------------------------------------------------------------

    def get_result(self, result_id: str) -> Any:
        from .models import TaskJob
        from .results import result_of

        try:
            job = TaskJob.objects.get(pk=int(result_id), backend=self.alias)
        except (TaskJob.DoesNotExist, ValueError, TypeError):
            raise TaskResultDoesNotExist(result_id) from None
        return result_of(job)

    def check(self, **kwargs: Any) -> list[Any]:
        from .checks import check_backend

        return check_backend(self)
