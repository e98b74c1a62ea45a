"""``TaskHandler``: runs the tasks of one ``DatabaseBackend`` with the engine."""

from __future__ import annotations

import functools
import json
from inspect import iscoroutinefunction
from typing import Any

from asgiref.sync import sync_to_async
from django.db.models import Q
from django.utils import timezone

from ..control.periodic import Periodic
from ..exceptions import NonRetryableError
from ..handler import Handler, seconds
from ..states import JobState
from . import compat
from .compat import normalize_json
from .models import TaskJob
from .options import TaskOptions, periodic_of
from .results import finish, load_task, result_of

tasks = compat.require()
signals = compat.signals
#: Return values normalize_json gives back as they are.
_SCALARS = frozenset({str, int, float, bool})
#: Whether a task function is ``async def`` (looked up once per function).
_is_coroutine = functools.cache(iscoroutinefunction)


class TaskHandler(Handler):
    """The tasks of backend ``alias`` in ``queues`` (None: in every queue, for a
    backend whose ``QUEUES`` is empty): claimed by priority, then age.

    A run's options (``@task(max_retries=…)``, ``using(max_retries=…)``, stored when
    it was enqueued) win over the backend's ``OPTIONS``. What the task returns is
    stored in ``return_value``, what it raises in ``errors`` (one entry per attempt),
    each worker in ``worker_ids``, when its first attempt started in
    ``first_started_at``.
    """

    model = TaskJob
    ordering = ("-priority", "id")
    result_field = "return_value"
    errors_field = "errors"
    attempts_field = "worker_ids"
    first_claim_field = "first_started_at"
    queue_field = "queue_name"
    # The budget is each task's (retry_budget()); the claim's guard must not cut it.
    max_num_retries = 1_000_000
    #: Which tasks: ``async def`` functions (``AsyncTaskHandler``) or the others.
    serves_async = False

    def __init__(
        self, alias: str, queues: list[str] | None, options: TaskOptions, **overrides: Any
    ):
        engine = {
            "num_handlers": options["NUM_HANDLERS"],
            "prefetch": options["PREFETCH"],
            "interval": options["INTERVAL"],
            "heartbeat_interval": options["HEARTBEAT_INTERVAL"],
            "stalled_max_age": options["STALLED_MAX_AGE"],
            "max_num_resets": options["MAX_NUM_RESETS"],
            "max_snoozes": options["MAX_SNOOZES"],
            "weight": options["WEIGHT"],
        }
        super().__init__(**{**engine, **overrides})
        #: In a shared pool, NUM_HANDLERS (or --num-handlers) is a ceiling only if set.
        self._ceiling_set = "NUM_HANDLERS" in options.given or "num_handlers" in overrides
        self.alias = alias
        self.queues = None if queues is None else sorted(queues)
        self.options = options
        kind = " async" if self.serves_async else ""
        served = "*" if self.queues is None else ",".join(self.queues)
        self.name = f"tasks:{alias}[{served}]{kind}"  # type: ignore[misc]
        served_by = {"backend": alias, "is_async": self.serves_async}
        if self.queues is not None:
            served_by["queue_name__in"] = self.queues
        self.dequeue_filter = Q(**served_by)  # type: ignore[misc]
        retention = options["RESULT_RETENTION"]
        if retention is not None:
            self.retention = dict.fromkeys(  # type: ignore[misc]
                (JobState.COMPLETED, JobState.FAILED, JobState.CANCELED), retention
            )

    def pool_ceiling(self, size: int) -> int:
        return min(self.num_handlers, size) if self._ceiling_set else size

    def periodic_schedules(self) -> list[Periodic]:
        """The backend's ``SCHEDULES`` whose task runs in a queue this handler serves."""
        found = []
        for name, entry in self.options["SCHEDULES"].items():
            task = load_task(entry["task"])
            if self.serves(task.queue_name):
                found.append(periodic_of(f"tasks:{self.alias}:{name}", entry))
        return found

    def serves(self, queue_name: str) -> bool:
        return self.queues is None or queue_name in self.queues

    def enqueue_scheduled(self, periodic: Periodic) -> Any:
        """Enqueue the task of one tick (in the scheduler's transaction)."""
        fields = periodic.fields
        task = self.task(fields["task"]).using(backend=self.alias)
        job, _ = task.get_backend().enqueue_job(task, fields["args"], fields["kwargs"])
        return job

    def queue_pause_prefix(self) -> str:
        """A task queue is paused as ``tasks:<backend>:<queue>``."""
        return f"tasks:{self.alias}:"

    # -- per task options ------------------------------------------------------------

    @functools.cached_property
    def _tasks(self) -> dict[str, Any]:
        return {}

    def task(self, path: str) -> Any:
        """The task a row names (imported once per worker)."""
        task = self._tasks.get(path)
        if task is None:
            try:
                task = load_task(path)
            except (ImportError, TypeError) as exc:
                raise NonRetryableError(f"cannot load task {path!r}: {exc}") from exc
            self._tasks[path] = task
        return task

    def _option(self, job: Any, name: str, key: str) -> Any:
        """The option a run was enqueued with, else its task's (a run enqueued without
        it, or by an older release), else the backend's."""
        stored = job.options
        if stored and stored.get(name) is not None:
            return stored[name]
        try:
            task = self.task(job.task_path)
        except NonRetryableError:
            return self.options[key]
        return self.options.for_task(task, name, key)

    def retry_budget(self, job: Any) -> int:
        return int(self._option(job, "max_retries", "MAX_RETRIES"))

    def shown_retry_budget(self, job: Any) -> int:
        # The run's own option, else the backend's: its task_path is not imported.
        stored = job.options.get("max_retries") if job.options else None
        return int(stored if stored is not None else self.options["MAX_RETRIES"])

    def retry_delay(self, num_failures: int, job: Any = None) -> float:
        if job is None:
            return super().retry_delay(num_failures)
        after = self._option(job, "retry_after", "RETRY_AFTER") or 0.0
        backoff = self._option(job, "retry_backoff", "RETRY_BACKOFF")
        cap = self._option(job, "retry_max_delay", "RETRY_MAX_DELAY")
        delay = float(after * backoff ** max(num_failures - 1, 0))
        return min(delay, float(cap)) if cap is not None else delay

    def maximum_runtime(self, job: Any) -> float | None:
        return seconds(self._option(job, "max_runtime", "MAX_RUNTIME"))

    # -- running ---------------------------------------------------------------------

    def _started(self, job: Any) -> tuple[Any, Any, list[Any]]:
        """The task of ``job``, its ``TaskResult`` (``task_started`` sends it) and the
        positional arguments it is called with."""
        task = self.task(job.task_path)
        result = job._dbworker_started = result_of(job, task)
        args = (
            [compat.TaskContext(task_result=result), *job.args] if task.takes_context else job.args
        )
        return task, result, args

    @functools.cached_property
    def sender(self) -> type:
        """What the tasks signals are sent by: the backend's class, as Django's own
        backends send them (a receiver may connect with ``sender=DatabaseBackend``)."""
        return type(tasks.task_backends[self.alias])

    def handle(self, job: Any) -> Any:
        task, result, args = self._started(job)
        signals.task_started.send(self.sender, task_result=result)
        if _is_coroutine(task.func):  # enqueued before is_async was recorded
            return self._await(task, task.func(*args, **job.kwargs))
        return self._returned(task, task.func(*args, **job.kwargs))

    async def _await(self, task: Any, coroutine: Any) -> Any:
        return self._returned(task, await coroutine)

    @staticmethod
    def _returned(task: Any, value: Any) -> Any:
        """A return value as stored (JSON), or the task fails saying why."""
        if value is None or type(value) in _SCALARS:
            return value  # what normalize_json gives, without its checks
        try:
            return normalize_json(value)
        except (TypeError, ValueError):
            raise NonRetryableError(
                f"task {task.module_path} returned a {type(value).__module__}."
                f"{type(value).__qualname__}, which is not JSON-serialisable"
            ) from None

    def post_handle(self, job: Any, outcome: Any) -> None:
        """Once the outcome is written: ``task_finished`` for a task that finished
        (succeeded, or failed for good); a task waiting for its retry is not."""
        if outcome.state not in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELED):
            return
        # The row as the outcome left it, without reading it back.
        job.state = outcome.state
        job.finished_at = timezone.now()
        if outcome.state == JobState.COMPLETED and outcome.result is not None:
            job.return_value = None if outcome.result == "null" else json.loads(outcome.result)
        elif outcome.error is not None:
            kind = type(outcome.error)
            job.errors = [
                *(job.errors or []),
                {
                    "exception_class_path": f"{kind.__module__}.{kind.__qualname__}",
                    "traceback": (outcome.message or "").split("\n\n", 1)[-1],
                },
            ]
        # The TaskResult task_started sent, brought up to date (handle ran), else anew.
        result = job.__dict__.pop("_dbworker_started", None)
        if result is None:
            result = result_of(job, self.task(job.task_path))
        else:
            finish(result, job)
        error = outcome.error
        if result.status == compat.TaskResultStatus.FAILED and error is not None:
            # In an exception handler, as Django's backends send it: its log record of
            # the failure carries the traceback (sys.exc_info()).
            try:
                raise error
            except BaseException:
                signals.task_finished.send(self.sender, task_result=result)
        else:
            signals.task_finished.send(self.sender, task_result=result)


class AsyncTaskHandler(TaskHandler):
    """The ``async def`` tasks of a backend's queues, as coroutines on the worker's
    event loop (up to ``NUM_HANDLERS`` in flight). ``task_started`` goes out with
    ``asend``: sync receivers run in asgiref's sync thread, as Django runs them."""

    serves_async = True

    def periodic_schedules(self) -> list[Periodic]:
        return []  # the sync handler of the same queues enqueues every schedule

    async def handle(self, job: Any) -> Any:
        task, result, args = self._started(job)
        await signals.task_started.asend(self.sender, task_result=result)
        if iscoroutinefunction(task.func):
            value = await task.func(*args, **job.kwargs)
        else:  # no longer async since it was enqueued
            value = await sync_to_async(task.func, thread_sensitive=False)(*args, **job.kwargs)
        return self._returned(task, value)


def task_handlers(
    aliases: list[str] | None = None, queues: list[str] | None = None, **overrides: Any
) -> list[TaskHandler]:
    """A ``TaskHandler`` and an ``AsyncTaskHandler`` per ``DatabaseBackend`` of
    ``TASKS`` (or those ``aliases``), for its queues (or those of ``queues`` it has).
    A backend whose ``QUEUES`` is empty accepts any queue name (Django validates
    none): its handlers serve every queue, or exactly ``queues``.
    ``ValueError`` says what does not fit."""
    from .backend import DatabaseBackend

    backends = tasks.task_backends
    configured = [
        alias
        for alias in backends.settings
        if isinstance(backends[alias], DatabaseBackend) and (not aliases or alias in aliases)
    ]
    for alias in aliases or []:
        if alias not in configured:
            raise ValueError(
                f"TASKS has no backend {alias!r} of django_dbworker.tasks.DatabaseBackend"
            )
    if not configured:
        raise ValueError("TASKS has no backend of django_dbworker.tasks.DatabaseBackend")
    handlers = []
    for alias in configured:
        backend = backends[alias]
        wanted: list[str] | None = sorted(backend.queues) if backend.queues else None
        if queues and wanted is None:
            wanted = sorted(set(queues))
        elif queues and wanted is not None:
            unknown = sorted(set(queues) - set(wanted))
            if unknown and len(configured) == 1:
                raise ValueError(
                    f"queue {', '.join(map(repr, unknown))} is not one of TASKS[{alias!r}]"
                    f"['QUEUES'] ({', '.join(wanted)})"
                )
            wanted = [q for q in wanted if q in queues]
        if wanted is None or wanted:
            handlers += [
                kind(alias, wanted, backend.engine, **overrides)
                for kind in (TaskHandler, AsyncTaskHandler)
            ]
    return handlers
