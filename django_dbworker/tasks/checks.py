"""System checks of the tasks app (``dbworker.E101`` …)."""

from __future__ import annotations

from typing import Any

from django.core import checks

from ..text import sentence
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
    """Problems with one ``DatabaseBackend`` of ``TASKS`` (its ``check()``, which Django's
    tasks framework calls): bad ``OPTIONS`` (E102), the app not installed (E103; then
    ``django_dbworker``'s own check leaves it to this one)."""
    from django.apps import apps

    from ..checks import tasks_app_missing

    found: list[checks.CheckMessage] = [
        checks.Error(sentence(f"TASKS[{backend.alias!r}]: {problem}"), id="dbworker.E102")
        for problem in problems(backend.options)
    ]
    if not apps.is_installed("django_dbworker.tasks"):
        found.append(tasks_app_missing(backend.alias))
    return found
