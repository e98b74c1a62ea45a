"""The handlers a project has, for the operator's tools (the admin, ``manage.py
dbworker``): those its settings name, ``DBWORKER["HANDLERS"]`` and the task handlers of
the ``DatabaseBackend`` backends of ``TASKS``, and the schedules they declare.

Only the settings are read: the handler names of the worker registry are labels a
worker reports of itself; nothing here imports or builds what a row of the database
names."""

from __future__ import annotations

import contextlib

from django.apps import apps

from .control.pause import pause_name_problem
from .handler import Handler, known_handlers


def configured_handlers() -> list[Handler]:
    """The handlers of ``DBWORKER["HANDLERS"]`` and of the task backends of ``TASKS``."""
    handlers = known_handlers()
    if apps.is_installed("django_dbworker.tasks"):
        from .tasks import compat

        if compat.AVAILABLE:
            from .tasks.handler import task_handlers

            with contextlib.suppress(ValueError):  # no backend of ours in TASKS
                handlers += task_handlers()
    return handlers


def pausable_handlers() -> list[Handler]:
    """What ``manage.py dbworker pause`` and the admin's pause form accept names of."""
    return configured_handlers()


def running_handler_names() -> list[str]:
    """The handler names the worker registry lists: labels, as workers report them."""
    from .models import WorkerProcess

    try:
        listed = list(WorkerProcess.objects.values_list("handlers", flat=True))
    except Exception:  # no registry table yet (migrate not run)
        return []
    return sorted({str(n) for names in listed if isinstance(names, list) for n in names})


def pause_problem(name: str, handlers: list[Handler] | None = None) -> str | None:
    """None if ``name`` may be paused: a name of a configured handler (or of a queue of
    one, ``pause_name_problem``) or a handler name the worker registry lists; else one
    line saying why not."""
    if name in running_handler_names():
        return None
    return pause_name_problem(name, pausable_handlers() if handlers is None else handlers)


def declared_schedules(handlers: list[Handler] | None = None) -> dict[str, str]:
    """The name of each schedule the configured handlers declare, and the name of the
    handler that declares it."""
    declared: dict[str, str] = {}
    for handler in configured_handlers() if handlers is None else handlers:
        for periodic in handler.periodic_schedules():
            declared.setdefault(periodic.name, handler.get_name())
    return declared
