"""A ``TaskJob`` row as the ``TaskResult`` Django's tasks framework hands out."""

from __future__ import annotations

import dataclasses
from typing import Any

from django.utils.module_loading import import_string

from ..states import JobState
from . import compat

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
    task = _as_enqueued(task, job.priority, job.queue_name, job.backend)
    if job.run_after is not None:
        task = task.using(run_after=job.run_after)
    result = _new_result(
        task=task,
        id=str(job.pk),
        enqueued_at=job.enqueued_at,
        started_at=job.started_at,
        last_attempted_at=job.started_at,
        args=list(job.args or []),
        kwargs=dict(job.kwargs or {}),
        backend=job.backend,
        worker_ids=[str(worker) for worker in (job.worker_ids or [])],
        **_progress(job),
    )
    _keep_return_value(result, job)
    return result


def _new_result(**values: Any) -> Any:
    """``TaskResult(**values)`` without its ``__post_init__``, which runs
    ``normalize_json`` over ``args`` and ``kwargs``: a row's are JSON already (stored
    normalised at enqueue time), and that is half the cost of building a result.
    Should Django's ``TaskResult`` have other fields than these, the constructor."""
    if not _DIRECT:
        return compat.TaskResult(**values)
    result = object.__new__(compat.TaskResult)
    for name, value in values.items():
        object.__setattr__(result, name, value)
    object.__setattr__(result, "_return_value", None)
    return result


def finish(result: Any, job: Any) -> None:
    """Bring ``result``, the ``TaskResult`` of ``job`` when it started, to what
    ``result_of(job)`` gives now that it finished: Django's own backends send the one
    object with ``task_started`` and ``task_finished`` likewise."""
    for name, value in _progress(job).items():
        object.__setattr__(result, name, value)
    _keep_return_value(result, job)


def _progress(job: Any) -> dict[str, Any]:
    """The fields of a ``TaskResult`` that change as its task runs."""
    status = STATUS[job.state]
    errors = job.errors
    return {
        "status": status,
        "finished_at": job.finished_at if status in _FINISHED else None,
        "errors": [
            compat.TaskError(
                exception_class_path=str(error.get("exception_class_path", "")),
                traceback=str(error.get("traceback", "")),
            )
            for error in errors
            if isinstance(error, dict)
        ]
        if errors
        else [],
    }


def _keep_return_value(result: Any, job: Any) -> None:
    if job.state == JobState.COMPLETED:
        object.__setattr__(result, "_return_value", job.return_value)


def _as_enqueued(task: Any, priority: int, queue_name: str, backend: str) -> Any:
    """``task`` with the priority, queue and backend a row was enqueued with.
    ``Task.using()`` validates the copy against its backend each time (most of the
    cost of a no-op task): the copies are kept, one per combination."""
    if (task.priority, task.queue_name, task.backend) == (priority, queue_name, backend):
        return task
    key = (task, priority, queue_name, backend)
    found = _variants.get(key)
    if found is None:
        if len(_variants) > 1_000:
            _variants.clear()
        found = _variants[key] = task.using(
            priority=priority, queue_name=queue_name, backend=backend
        )
    return found


_variants: dict[tuple[Any, int, str, str], Any] = {}

_FINISHED = {compat.TaskResultStatus.SUCCESSFUL, compat.TaskResultStatus.FAILED}
#: Whether ``TaskResult`` has exactly the fields ``result_of`` sets (``_new_result``).
_DIRECT = {field.name for field in dataclasses.fields(compat.TaskResult)} == {
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
}
