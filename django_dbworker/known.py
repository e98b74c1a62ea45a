"""The handlers a project has, for the operator's tools: those ``known_handlers`` finds
(``DBWORKER["HANDLERS"]``, the worker registry) and the task handlers of ``TASKS``."""

from __future__ import annotations

import contextlib

from django.apps import apps

from .handler import Handler, known_handlers


def pausable_handlers() -> list[Handler]:
    """What ``manage.py dbworker pause`` and the admin's pause form accept names of."""
    handlers = known_handlers()
    if apps.is_installed("django_dbworker.tasks"):
        from .tasks import compat

        if compat.AVAILABLE:
            from .tasks.handler import task_handlers

            with contextlib.suppress(ValueError):  # no backend of ours in TASKS
                handlers += task_handlers()
    return handlers
