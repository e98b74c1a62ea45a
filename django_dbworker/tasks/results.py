"""A ``TaskJob`` row as the ``TaskResult`` Django's tasks framework hands out."""

from __future__ import annotations

import dataclasses
import types
from typing import Any

from django.utils.module_loading import import_string

from ..sql.jobs import history_time
from ..states import JobState
from . import compat
from .options import TASK_OPTIONS, stored_value

compat.require()

#: The engine's states as the tasks framework names them. An errored task waiting
#: for its retry is READY ("ready to be executed again"); a canceled one FAILED.
#: Keyed by the state's text (a ``JobState`` finds its entry too).
STATUS = {
    str(state): compat.TaskResultStatus[status]
    for state, status in (
        (JobState.QUEUED, "READY"),
        (JobState.ERRORED, "READY"),
        (JobState.PROCESSING, "RUNNING"),
        (JobState.COMPLETED, "SUCCESSFUL"),
        (JobState.FAILED, "FAILED"),
        (JobState.CANCELED, "FAILED"),
    )
}


class DatabaseTaskResult(compat.TaskResult):  # type: ignore[misc]
    """Django's ``TaskResult``, with ``wait()`` and ``await_done()``: what the
    ``DatabaseBackend`` hands out (an instance of Django's class all the same)."""

    __slots__ = ()

    def wait(self, timeout: float | None = None) -> DatabaseTaskResult:
        """Block until the task succeeded or failed (or was canceled), then return this
        result refreshed. ``django_dbworker.WaitTimeout`` past ``timeout`` seconds. See
        ``WorkerJob.wait()``: every waiter of the process shares one connection."""
        from ..waiting import deadline_of, remaining, wait_for

        deadline = deadline_of(timeout)
        job = self._job()
        while True:
            wait_for(job, remaining(deadline), timeout)
            self.refresh()
            if self.is_finished:  # else retried meanwhile: wait on
                return self

    async def await_done(self, timeout: float | None = None) -> DatabaseTaskResult:
        """``wait()`` for coroutines."""
        from asgiref.sync import sync_to_async

        from ..waiting import await_for, deadline_of, remaining

        deadline = deadline_of(timeout)
        job = await sync_to_async(self._job)()
        while True:
            await await_for(job, remaining(deadline), timeout)
            await self.arefresh()
            if self.is_finished:  # else retried meanwhile: wait on
                return self

    def _job(self) -> Any:
        """The row of this result (its key only)."""
        from .models import TaskJob

        return TaskJob._base_manager.only("pk").get(result_id=self.id, backend=self.backend)


def load_task(path: str) -> Any:
    """The ``Task`` object a dotted path names (what ``@task`` made of the function)."""
    task = import_string(path)
    if not isinstance(task, compat.Task):
        raise TypeError(f"{path!r} is not a task (decorate it with @task)")
    return task


def result_of(job: Any, task: Any = None) -> Any:
    """The ``TaskResult`` of ``job``; ``task`` if the caller has it at hand."""
    if task is None:
        task = load_task(job.task_path)
    task = _as_enqueued(task, job.priority, job.queue_name, job.backend, job.options)
    if job.run_after is not None:
        task = task.using(run_after=job.run_after)
    status, finished_at, errors, return_value = _progress(job)
    started_at, last_attempted_at = attempt_times(job)
    return _new_result(
        task,
        job.result_id.hex,  # a fifth of str()'s cost
        status,
        job.enqueued_at,
        started_at,
        finished_at,
        last_attempted_at,
        list(job.args or []),
        dict(job.kwargs or {}),
        job.backend,
        errors,
        [str(worker) for worker in (job.worker_ids or [])],
        return_value,
    )


def attempt_times(job: Any) -> tuple[Any, Any]:
    """When the first attempt of ``job`` started (Django's ``started_at``) and when its
    latest did (``last_attempted_at``): ``first_started_at``, which the first claim
    sets, and the row's ``started_at``, which each claim sets. While there was one
    attempt both are ``first_started_at`` (the claim's two times can differ by
    microseconds on SQLite, whose clock moves within a statement). A row back in the
    queue (reset, requeued, retried from the admin) has its latest attempt's start in
    ``history`` only; so has its first attempt when a worker of an older release
    claimed it."""
    attempts = len(job.worker_ids or ())
    first, last = job.first_started_at, job.started_at
    if first is None or (last is None and attempts > 1):
        history = [entry for entry in job.history or () if isinstance(entry, dict)]
        if history:
            first = first or history_time(history[0].get("started_at"))
            last = last or history_time(history[-1].get("started_at"))
        first = first or last
    return first, (first if attempts <= 1 else last)


def _new_result(*values: Any) -> Any:
    """``TaskResult`` of ``values`` (in ``_FIELDS`` order) without its
    ``__post_init__``, which runs ``normalize_json`` over ``args`` and ``kwargs``: a
    row's are JSON already (stored normalised at enqueue time), and that is half the
    cost of building a result. Should Django's ``TaskResult`` have other fields than
    these, the constructor."""
    if not _SETTERS:
        *fields, return_value = values
        result = DatabaseTaskResult(**dict(zip(_FIELDS[:-1], fields, strict=True)))
        object.__setattr__(result, "_return_value", return_value)
        return result
    result = object.__new__(DatabaseTaskResult)
    for set_slot, value in zip(_SETTERS, values, strict=True):
        set_slot(result, value)
    return result


def finish(result: Any, job: Any) -> None:
    """Bring ``result``, the ``TaskResult`` of ``job`` when it started, to what
    ``result_of(job)`` gives now that it finished: Django's own backends send the one
    object with ``task_started`` and ``task_finished`` likewise."""
    status, finished_at, errors, return_value = _progress(job)
    object.__setattr__(result, "status", status)
    object.__setattr__(result, "finished_at", finished_at)
    object.__setattr__(result, "errors", errors)
    object.__setattr__(result, "_return_value", return_value)


def _progress(job: Any) -> tuple[Any, Any, list[Any], Any]:
    """The fields of a ``TaskResult`` that change as its task runs: status,
    finished_at, errors (a ``TaskError`` per attempt that raised), return value."""
    status = STATUS[job.state]
    errors = [
        compat.TaskError(
            exception_class_path=str(error.get("exception_class_path", "")),
            traceback=str(error.get("traceback", "")),
        )
        for error in job.errors or ()
        if isinstance(error, dict)
    ]
    return (
        status,
        job.finished_at if status in _FINISHED else None,
        errors,
        job.return_value if job.state == JobState.COMPLETED else None,
    )


def _as_enqueued(
    task: Any, priority: int, queue_name: str, backend: str, options: dict[str, Any] | None
) -> Any:
    """``task`` with the priority, queue, backend and engine options a row was enqueued
    with. ``Task.using()`` validates the copy against its backend each time (most of
    the cost of a no-op task): the copies are kept, one per combination."""
    changed = _changed_options(task, options) if options else None
    if not changed and (task.priority, task.queue_name, task.backend) == (
        priority,
        queue_name,
        backend,
    ):
        return task
    changed = changed or {}
    key = (task, priority, queue_name, backend, tuple(sorted(changed.items())))
    found = _variants.get(key)
    if found is None:
        if len(_variants) > 1_000:
            _variants.clear()
        found = _variants[key] = task.using(
            priority=priority, queue_name=queue_name, backend=backend, **changed
        )
    return found


def _changed_options(task: Any, options: dict[str, Any]) -> dict[str, Any]:
    """The engine options a row stores that its task (as the code has it now) has not."""
    return {
        name: value
        for name, value in options.items()
        if name in TASK_OPTIONS
        and hasattr(task, name)
        and value is not None
        and value != stored_value(name, getattr(task, name))
    }


_variants: dict[tuple[Any, ...], Any] = {}

_FINISHED = {compat.TaskResultStatus.SUCCESSFUL, compat.TaskResultStatus.FAILED}
#: ``TaskResult``'s fields in the order ``_new_result`` takes them.
_FIELDS = (
    "task",
    "id",
    "status",
    "enqueued_at",
    "started_at",
    "finished_at",
    "last_attempted_at",
    "args",
    "kwargs",
    "backend",
    "errors",
    "worker_ids",
    "_return_value",
)


def _slot_setters() -> tuple[Any, ...]:
    """Each field's slot setter, if ``TaskResult`` is a slotted dataclass of exactly
    ``_FIELDS``; else none (``_new_result`` then calls the constructor)."""
    if {field.name for field in dataclasses.fields(compat.TaskResult)} != set(_FIELDS):
        return ()
    slots = [vars(compat.TaskResult).get(name) for name in _FIELDS]
    if not all(isinstance(slot, types.MemberDescriptorType) for slot in slots):
        return ()
    return tuple(slot.__set__ for slot in slots)


_SETTERS = _slot_setters()
