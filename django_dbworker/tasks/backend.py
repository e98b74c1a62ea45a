"""``DatabaseBackend``: Django's tasks framework on the worker engine.

``TASKS = {"default": {"BACKEND": "django_dbworker.tasks.DatabaseBackend",
"QUEUES": [...], "OPTIONS": {...}}}``. Enqueueing inserts one ``TaskJob`` row
(part of the caller's transaction; workers wake at commit); ``runworker
--tasks`` runs them with every guarantee of the engine.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import uuid
from collections.abc import Callable
from datetime import timedelta
from inspect import iscoroutinefunction
from typing import Any

from django.db import router

from ..text import fitted_key
from . import compat
from .compat import normalize_json
from .options import TASK_OPTIONS, TaskOptions, refuse_unknown, stored_options

compat.require()
Task = compat.Task
BaseTaskBackend = compat.BaseTaskBackend
InvalidTask = compat.InvalidTask
TaskResultDoesNotExist = compat.TaskResultDoesNotExist


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DatabaseTask(Task):  # type: ignore[misc,valid-type]
    """A task with the engine's per-task options, given to ``@task(...)`` (Django
    6.1's, or ``django_dbworker.tasks.task`` on every version) or to ``using(...)``:
    ``max_retries`` (errors after the first that are retried; the backend's
    ``MAX_RETRIES`` when None), ``retry_after`` (seconds or a ``timedelta``),
    ``retry_backoff``, ``retry_max_delay``, ``max_runtime``. None: the backend's.
    A run keeps the options it was enqueued with.

    ``unique``: while a run of this task with the same key is queued, running or
    waiting for a retry, ``enqueue()`` returns that run's result instead of adding
    one. ``True`` keys by the arguments; a function gets the task's arguments and
    returns the key (a string), or None for "not unique this time".

    ``atomic``: the function runs in a transaction on the tasks' database that also
    writes the run's completion, fenced to the attempt (docs/transactions.md); a plain
    ``def`` function only. Set on ``@task``, not ``using()``: a run looks it up on its
    task.
    """

    max_retries: int | None = None
    retry_after: float | timedelta | None = None
    retry_backoff: float | None = None
    retry_max_delay: float | timedelta | None = None
    max_runtime: float | timedelta | None = None
    unique: bool | Callable[..., str | None] = False
    atomic: bool = False

    def __new__(cls, *args: Any, **kwargs: Any) -> DatabaseTask:
        # Before the generated __init__ refuses an unknown keyword: say which one was
        # meant (a handler's spelling, a typo).
        refuse_unknown(kwargs, cls.__dataclass_fields__, "task")
        return object.__new__(cls)

    def using(
        self,
        *,
        priority: int | None = None,
        queue_name: str | None = None,
        run_after: Any = None,
        backend: str | None = None,
        **options: Any,
    ) -> Any:
        """Django's ``Task.using()``, and the engine options of this class
        (``max_retries``, ``retry_after``…, ``unique``) for the runs of the copy; None
        leaves one as it is."""
        task = Task.using(
            self, priority=priority, queue_name=queue_name, run_after=run_after, backend=backend
        )
        refuse_unknown(options, ENGINE_FIELDS, "using")
        changes = {name: value for name, value in options.items() if value is not None}
        return dataclasses.replace(task, **changes) if changes else task


#: What ``using()`` takes besides Django's own arguments.
ENGINE_FIELDS = (*TASK_OPTIONS, "unique")


def task(
    function: Callable[..., Any] | None = None,
    *,
    priority: int = compat.DEFAULT_TASK_PRIORITY,
    queue_name: str = compat.DEFAULT_TASK_QUEUE_NAME,
    backend: str = compat.DEFAULT_TASK_BACKEND_ALIAS,
    takes_context: bool = False,
    **options: Any,
) -> Any:
    """``@task``, with the engine options of ``DatabaseTask`` on every Django version
    (Django 6.0's ``@task`` takes none; 6.1's passes them on as this does):
    ``@task(max_retries=3, retry_after=30)``."""
    if "run_after" in options:
        raise TypeError("run_after is set per run: use .using(run_after=...)")
    if options:
        backend_class = type(compat.tasks.task_backends[backend])
        if not issubclass(backend_class.task_class, DatabaseTask):
            raise TypeError(
                f"@task({', '.join(options)}): engine options need TASKS[{backend!r}] to be "
                f"django_dbworker.tasks.DatabaseBackend, not "
                f"{backend_class.__module__}.{backend_class.__qualname__}"
            )

    def wrapper(func: Callable[..., Any]) -> Any:
        task_class = compat.tasks.task_backends[backend].task_class
        return task_class(
            func=func,
            priority=priority,
            queue_name=queue_name,
            backend=backend,
            takes_context=takes_context,
            run_after=None,  # Django 6.0's Task has no default for it
            **options,
        )

    return wrapper(function) if function is not None else wrapper


def result_key(result_id: Any) -> uuid.UUID | None:
    """The ``TaskJob.result_id`` of a result id, or None unless it is one in the form the
    backend hands out: the UUID's 32 lowercase hex digits (``uuid.hex``). No
    whitespace, underscore, hyphen, brace, prefix or other spelling of the same UUID,
    no primary key."""
    if type(result_id) is not str or len(result_id) != 32:
        return None
    try:
        key = uuid.UUID(hex=result_id)
    except ValueError:
        return None
    return key if key.hex == result_id else None


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
        return self.enqueue_job(task, args, kwargs)[1]

    def enqueue_job(self, task: Any, args: Any, kwargs: Any) -> tuple[Any, Any]:
        """``enqueue()``, and the ``TaskJob`` row of the run (the scheduler's tick
        records its primary key)."""
        from ..control.unique import enqueue_unique
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
            is_async=iscoroutinefunction(task.func),
            options=stored_options(task),
        )
        job.unique_key = self._unique_key(task, args, kwargs)
        if job.unique_key is not None:
            job, created = enqueue_unique(TaskJob, job)
            if not created:  # a run with this key is active: its result
                return job, result_of(job, task)
        else:
            insert_notifying(job, router.db_for_write(TaskJob))  # the INSERT and NOTIFY
        result = result_of(job, task)
        compat.signals.task_enqueued.send(type(self), task_result=result)
        return job, result

    @staticmethod
    def _unique_key(task: Any, args: list[Any], kwargs: dict[str, Any]) -> str | None:
        unique = getattr(task, "unique", False)
        if not unique:
            return None
        if unique is True:
            key = json.dumps([args, kwargs], sort_keys=True, separators=(",", ":"))
            key = hashlib.sha256(key.encode()).hexdigest()
        else:
            key = unique(*args, **kwargs)
            if key is None:
                return None
        # Digested, never cut, when it does not fit the column: two keys sharing their
        # first 255 characters would otherwise be one, and the second caller would get
        # the first one's run (its arguments, later its return value).
        from .models import TaskJob

        limit = TaskJob._meta.get_field("unique_key").max_length or 255
        return fitted_key(f"{task.module_path}:{key}", limit)

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
        """The result of ``result_id``, exactly as ``TaskResult.id`` gave it (a random
        UUID's 32 hex digits); anything else does not exist."""
        from .models import TaskJob
        from .results import result_of

        key = result_key(result_id)
        if key is None:
            raise TaskResultDoesNotExist(result_id)
        try:
            job = TaskJob.objects.get(result_id=key, backend=self.alias)
        except TaskJob.DoesNotExist:
            raise TaskResultDoesNotExist(result_id) from None
        return result_of(job)

    def check(self, **kwargs: Any) -> list[Any]:
        from .checks import check_backend

        return check_backend(self)
