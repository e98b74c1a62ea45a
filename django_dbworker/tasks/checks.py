"""System checks of the tasks app (``dbworker.E101`` …)."""

from __future__ import annotations

from typing import Any

from django.core import checks

from . import compat
from .options import problems


@checks.register("dbworker")
def check_tasks_framework(**kwargs: Any) -> list[checks.CheckMessage]:
    if compat.AVAILABLE:
        return []
    return [
        checks.Error(
            "django_dbworker.tasks needs Django's tasks framework.",
            hint="Use Django >= 6.0, or on Django 5.2 `pip install django-tasks` "
            "(the backport; its TASKS setting works the same).",
            id="dbworker.E101",
        )
    ]


def check_backend(backend: Any) -> list[checks.CheckMessage]:
    """Problems with one ``DatabaseBackend`` of ``TASKS`` (its ``check()``)."""
    # E103 (the app not installed) is django_dbworker's own check: this one runs only
    # once something imported django.tasks.
    return [
        checks.Error(f"TASKS[{backend.alias!r}]: {problem}.", id="dbworker.E102")
        for problem in problems(backend.options)
    ]
