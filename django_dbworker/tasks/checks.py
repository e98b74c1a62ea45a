"""System checks of the tasks app (``dbworker.E101`` …)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
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
    found: list[checks.CheckMessage] = [
        checks.Error(f"TASKS[{backend.alias!r}]: {problem}.", id="dbworker.E102")
        for problem in problems(backend.options)
    ]
    if "django_dbworker.tasks" not in settings.INSTALLED_APPS and not any(
        app.endswith(".DbWorkerTasksConfig") for app in settings.INSTALLED_APPS
    ):
        found.append(
            checks.Error(
                f"TASKS[{backend.alias!r}] uses django_dbworker.tasks.DatabaseBackend, but "
                "the app is not installed.",
                hint='Add "django_dbworker.tasks" to INSTALLED_APPS (after "django_dbworker") '
                "and run migrate.",
                id="dbworker.E103",
            )
        )
    return found
